package peers

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// Many connections streaming large summaries at once: the bytes held by summaries in
// flight stay within peers.max_inbound_bytes over every connection, streams past
// 2 × max_peers are refused, the index sweep runs while they stream (each Book holds a
// worker's lock for one batch), and once the senders are gone every goroutine they
// caused has ended and the memory is back. Before, 200 connections streaming 3.8 MB
// summaries left 359 goroutines and 540 MB queued behind one mutex two minutes later.
func TestInboundFloodIsBoundedAndLeavesNothing(t *testing.T) {
	const (
		msgBytes = 1 << 20
		inBytes  = 4 << 20 // 4 summaries in flight at most
		conns    = 40
		perConn  = 4 // 160 streams: 128 (2 × max_peers) admitted, the rest refused busy
	)
	b := startReplica(t, "b", time.Minute, func(o *Options) {
		o.MaxMessageBytes, o.MaxInboundBytes, o.MaxKeysPerWorker = msgBytes, inBytes, 16384
	})
	b.peer("127.0.0.1:1") // loopback senders are admitted (no authentication configured)
	runtime.GC()
	baseG, baseHeap := runtime.NumGoroutine(), heapInUse()

	// ~0.5 MB per summary: 4 workers × 16,384 keys.
	summary := func(id string, seq uint64) []byte {
		s := &Summary{Replica: id, Incarnation: 1, Seq: seq, Sent: time.Now()}
		for w := range 4 {
			keys := make([]kvindex.Key, 16384)
			for i := range keys {
				keys[i] = kvindex.Key(mix(uint64(seq)<<40 | uint64(w)<<20 | uint64(i))) // block keys are hashes
			}
			s.Workers = append(s.Workers, WorkerSummary{Worker: fmt.Sprintf("w%d", w), Booked: scoring.Booked{Requests: 1, Prefilling: 1, PrefillTokens: 100}, Keys: keys})
		}
		return encode(nil, s)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ccs []*grpc.ClientConn
	for c := range conns {
		cc := rawConn(t, b.addr)
		ccs = append(ccs, cc)
		for k := range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := openStream(ctx, cc)
				if err != nil {
					return
				}
				id := fmt.Sprintf("flood-%d-%d", c, k)
				for seq := uint64(1); seq <= 2; seq++ {
					if st.SendMsg(&frame{b: summary(id, seq)}) != nil {
						return
					}
				}
				<-ctx.Done()
			}()
		}
	}
	// While they stream: the bound holds at every sample, and the sweep completes.
	var peak float64
	peakHeap := heapInUse()
	sweeps := 0
	refused := float64(conns*perConn - 2*DefaultMaxPeers)
	busy := func() float64 { return testutil.ToFloat64(b.ms.Peers.Dropped.WithLabelValues(DropBusy)) }
	deadline := time.Now().Add(time.Minute)
	for (testutil.ToFloat64(b.ms.Peers.BytesReceived) < 16*msgBytes || busy() < refused) && time.Now().Before(deadline) {
		if v := testutil.ToFloat64(b.ms.Peers.InboundBytes); v > peak {
			peak = v
		}
		b.ix.Sweep()
		sweeps++
		peakHeap = max(peakHeap, heapInUse())
		time.Sleep(2 * time.Millisecond)
	}
	if peak > inBytes {
		t.Fatalf("inbound bytes reached %v, bound %d", peak, inBytes)
	}
	if got := busy(); got < refused {
		t.Errorf("dropped{busy} = %v: want at least the %v streams past 2 × max_peers", got, refused)
	}
	t.Logf("during the flood: %.0f MB received, peak in flight %.1f MB, %d sweeps, heap %d → peak %d MB, %d goroutines",
		testutil.ToFloat64(b.ms.Peers.BytesReceived)/1e6, peak/1e6, sweeps, baseHeap>>20, peakHeap>>20, runtime.NumGoroutine())

	stop()
	wg.Wait()
	for _, cc := range ccs {
		cc.Close()
	}
	waitFor(t, "every flood peer dropped", func() bool { return len(b.m.Snapshot().Peers) == 0 })
	waitFor(t, "goroutines back to baseline", func() bool { return runtime.NumGoroutine() <= baseG+5 })
	if got := testutil.ToFloat64(b.ms.Peers.InboundBytes); got != 0 {
		t.Fatalf("inbound bytes %v after the flood, want 0", got)
	}
	var after uint64
	waitFor(t, "heap back near baseline", func() bool {
		runtime.GC()
		after = heapInUse()
		return after < baseHeap+64<<20
	})
	t.Logf("after: heap %d MB, %d goroutines (baseline %d)", after>>20, runtime.NumGoroutine(), baseG)
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// mix is splitmix64's finalizer: distinct inputs give hash-like keys.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
