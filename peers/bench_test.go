package peers

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// benchSummary: 8 workers with open requests, each prefilling one new 4,000-token
// prefix (250 blocks of 16 tokens), with 300,000 tokens of decayed writes and, within
// the last router.LeftWindow (10 s), 20 first tokens and 20 finishes (2 req/s each).
func benchSummary() *Summary {
	now := time.Now()
	s := &Summary{Replica: "kvroute-7d9f8c6b5-x2kq9-1a2b3c", Incarnation: 1 << 62, Seq: 123456, Sent: now}
	for w := 0; w < 8; w++ {
		ws := WorkerSummary{Worker: fmt.Sprintf("vllm-%d", w), OldestPrefill: now,
			Booked: scoring.Booked{Requests: 12, Prefilling: 3, PrefillTokens: 12000, Decoding: 9}, Writes: 300000}
		for i := 20; i > 0; i-- {
			ws.FirstTokens = append(ws.FirstTokens, now.Add(-time.Duration(i)*500*time.Millisecond+100*time.Millisecond))
			ws.Finished = append(ws.Finished, now.Add(-time.Duration(i)*500*time.Millisecond))
		}
		for k := 0; k < 250; k++ {
			ws.Keys = append(ws.Keys, kvindex.Key(uint64(w)<<32|uint64(k)*0x9e3779b97f4a7c15))
		}
		s.Workers = append(s.Workers, ws)
	}
	return s
}

func BenchmarkEncode(b *testing.B) {
	s := benchSummary()
	buf := encode(nil, s)
	b.ReportAllocs()
	for b.Loop() {
		buf = encode(buf[:0], s)
	}
	b.ReportMetric(float64(len(buf)), "bytes/summary")
}

func BenchmarkDecode(b *testing.B) {
	buf := encode(nil, benchSummary())
	lim := Limits{MaxWorkers: DefaultMaxWorkers, MaxKeysPerWorker: DefaultMaxKeysPerWorker, MaxNameBytes: maxNameBytes}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decode(buf, lim); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf)), "bytes/summary")
}

// BenchmarkPeerStateMemory measures what one peer's state costs a receiver: the live
// heap after applying one summary of 64 workers, each with 12 booked requests and 250
// block keys being prefilled, to a Manager over a real index (the keys become
// speculative entries there), reported per worker and per key.
func BenchmarkPeerStateMemory(b *testing.B) {
	const nw, nk = 64, 250
	var names []*workers.Worker
	for w := 0; w < nw; w++ {
		names = append(names, &workers.Worker{Name: fmt.Sprintf("vllm-%d", w), Address: fmt.Sprintf("10.0.0.%d:8000", w), Models: []string{"m"}})
	}
	s := &Summary{Replica: "peer-a", Incarnation: 1, Seq: 1, Sent: time.Now()}
	for w := 0; w < nw; w++ {
		ws := WorkerSummary{Worker: names[w].Name, Booked: scoring.Booked{Requests: 12, Prefilling: 3, PrefillTokens: 12000, Decoding: 9}}
		for k := 0; k < nk; k++ {
			ws.Keys = append(ws.Keys, kvindex.Key(uint64(w)<<32|uint64(k+1)*0x9e3779b97f4a7c15))
		}
		s.Workers = append(s.Workers, ws)
	}
	var perWorker float64
	for b.Loop() {
		reg := workers.NewRegistry()
		ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute})
		reg.Subscribe(ix)
		reg.Set(names)
		r := router.New(router.Options{Registry: reg, Index: ix})
		m, err := New(Options{ID: "self", Router: r, Index: ix})
		if err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if err := m.apply(s, 1, "10.0.0.99:1", 0); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perWorker = float64(after.HeapAlloc-before.HeapAlloc) / nw
		runtime.KeepAlive(m)
		runtime.KeepAlive(ix)
	}
	b.ReportMetric(perWorker, "bytes/worker")
	b.ReportMetric(perWorker/nk, "bytes/key")
}
