package router_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// BenchmarkConcurrentPicks is the router's decision throughput under contention: 16
// streams (goroutines) pick and finish at once, whatever GOMAXPROCS is, so `-cpu 1,2,4`
// shows how decisions scale with cores (issue 17 target: ≥ 20,000 decisions/s with 64
// workers on 2 cores). One op is router.Pick + Ticket.FirstToken + Ticket.Done with the
// default policy (kvroute, learning predictor) for a completions request of 2,048 token
// ids (no tokenizer cost): block hashing of 128 keys, an index lookup over 64 workers,
// a TTFT prediction per worker, the booking and its speculative entries. Each stream
// cycles through 8 prompts sharing a 1,024-token prefix that one worker holds, so
// bookings, speculative entries and learning all change between picks. decisions/s is
// b.N over the wall time; run with -mutexprofile to see where picks wait.
func BenchmarkConcurrentPicks(b *testing.B) {
	const nw, streams, prompts = 64, 16, 8
	_, idx, r := benchRouter(b, nw, "w%02d")
	prefix := make([]uint32, 1024)
	for i := range prefix {
		prefix[i] = uint32(i*7919) % 151000
	}
	idx.Speculate("w07", kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), prefix, 16, nil))
	reqs := make([]*request.Request, streams*prompts)
	for i := range reqs {
		ids := append(make([]uint32, 0, 2048), prefix...)
		for j := 0; j < 1024; j++ {
			ids = append(ids, uint32(i*100_003+j*31)%151000)
		}
		reqs[i] = &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
	}
	var stream atomic.Int64
	ctx := context.Background()
	b.SetParallelism((streams + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	start, c0 := time.Now(), cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		s := int(stream.Add(1)-1) % streams
		n := 0
		for pb.Next() {
			t, err := r.Pick(ctx, reqs[s*prompts+n%prompts], router.PickOptions{RequestID: "bench"})
			if err != nil {
				b.Error(err)
				return
			}
			t.FirstToken(time.Time{})
			t.Done(200, response.Usage{}, time.Time{})
			n++
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

// benchRouter is the benchmarks' router: nw workers of model "m" named by the format
// name, an index with speculative entries kept an hour, the default policy.
func benchRouter(b *testing.B, nw int, name string) ([]*workers.Worker, *kvindex.Index, *router.Router) {
	reg := workers.NewRegistry()
	ws := make([]*workers.Worker, nw)
	for i := range ws {
		ws[i] = &workers.Worker{Name: fmt.Sprintf(name, i), Address: fmt.Sprintf("10.%d.%d.%d:8000", i/62500, i/250%250, i%250+1), Models: []string{"m"}}
	}
	reg.Set(ws)
	idx := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	pol, err := scoring.New(scoring.PolicyKVRoute, scoring.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r := router.New(router.Options{Registry: reg, Index: idx, Policy: pol, Models: []router.Model{{Name: "m", BlockSize: 16}},
		Metrics: metrics.NewUnregistered()})
	return ws, idx, r
}

// cpuTime is the process's user+system CPU time: on a shared machine wall time per op
// is inflated by preemption (a lock holder preempted stalls every stream), CPU time per
// op much less so.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadTime is the calling OS thread's CPU time (CLOCK_THREAD_CPUTIME_ID, Linux):
// what a goroutine locked to it ran, without the time the core ran anything else.
func threadTime() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3 // <linux/time.h>
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// BenchmarkSetPeerBookings is what a received peer summary costs the receiver's router:
// 8 workers, each with 2 peers reporting 250 block keys being prefilled (a new
// 4,000-token prefix at block size 16) and 64 of this replica's own prefilling requests
// whose speculative entries overlap them — the duplicate count
// (PeerWorker.DuplicateBlocks) walks every key once. One op = one SetPeerBookings.
func BenchmarkSetPeerBookings(b *testing.B) {
	const nw, peers, keys, own = 8, 2, 250, 64
	reg := workers.NewRegistry()
	ws := make([]*workers.Worker, nw)
	for i := range ws {
		ws[i] = &workers.Worker{Name: fmt.Sprintf("w%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"m"}}
	}
	reg.Set(ws)
	idx := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	rr, err := scoring.New(scoring.PolicyRoundRobin, scoring.Options{})
	if err != nil {
		b.Fatal(err)
	}
	rt := router.New(router.Options{Registry: reg, Index: idx, Policy: rr, Metrics: metrics.NewUnregistered(),
		Models: []router.Model{{Name: "m", BlockSize: 16}}})
	ctx := context.Background()
	prefix := func(w int) []uint32 {
		ids := make([]uint32, keys*16)
		for i := range ids {
			ids[i] = uint32(w*1_000_003 + i)
		}
		return ids
	}
	for i := range own { // round robin: 8 per worker, each worker's own prefix
		ids := append(prefix(i%nw), uint32(i)) // the first request books the prefix
		tk, err := rt.Pick(ctx, &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}, router.PickOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer tk.Done(200, response.Usage{}, time.Time{})
	}
	reports := make([][]kvindex.Key, nw)
	for w := range reports {
		reports[w] = kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), prefix(w), 16, nil)
	}
	b.ReportAllocs()
	for b.Loop() {
		m := make(map[string]router.PeerWorker, nw)
		for w := range nw {
			var p router.PeerWorker
			for range peers {
				p.Add(scoring.Booked{Requests: 4, Prefilling: 4, PrefillTokens: 4 * keys * 16}, nil, nil, router.PeerWrites{}, reports[w])
			}
			m[ws[w].Name] = p
		}
		rt.SetPeerBookings(m)
	}
	if d := rt.PeerBookings()["w0"].DuplicateBlocks; d != 2*keys {
		b.Fatalf("w0 duplicate blocks %d, want %d (both peers' keys are own ones)", d, 2*keys)
	}
}

// BenchmarkPickScale is one pick (router.Pick + Ticket.FirstToken + Ticket.Done, the
// default policy, a 2,048-token completions request: 128 block keys hashed, looked up,
// a TTFT prediction per worker, booked) with 64 and 1,000 workers of one model, each
// worker holding a 2,048-token prefix of its own in the index and one worker the
// request's 1,024-token prefix. One stream, so the latency of each pick is its cost:
// p50-us and p99-us over the run (wall time), p50-cpu-us and p99-cpu-us the same in
// the CPU time of the pick's own OS thread (the goroutine is locked to it), which
// leaves out the time other processes of a shared machine took the core (and counts
// the pick's GC assists); heap-B/worker is the heap the registry, index and router
// hold per worker after setup, B/op ÷ workers what one pick allocates per worker.
func BenchmarkPickScale(b *testing.B) {
	for _, nw := range []int{64, 1000} {
		b.Run(fmt.Sprintf("workers=%d", nw), func(b *testing.B) {
			runtime.GC()
			var m0 runtime.MemStats
			runtime.ReadMemStats(&m0)
			ws, idx, r := benchRouter(b, nw, "w%04d")
			seed := kvindex.Namespace{Model: "m"}.Seed()
			own := make([]uint32, 2048)
			for i, w := range ws {
				for j := range own {
					own[j] = uint32(i*2048+j) % 151000
				}
				idx.Speculate(w.Name, kvindex.HashBlocks(seed, own, 16, nil))
			}
			prefix := make([]uint32, 1024)
			for i := range prefix {
				prefix[i] = uint32(i*7919) % 151000
			}
			idx.Speculate(ws[7].Name, kvindex.HashBlocks(seed, prefix, 16, nil))
			reqs := make([]*request.Request, 64)
			for i := range reqs {
				ids := append(make([]uint32, 0, 2048), prefix...)
				for j := 0; j < 1024; j++ {
					ids = append(ids, uint32(i*100_003+j*31)%151000)
				}
				reqs[i] = &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
			}
			runtime.GC()
			var m1 runtime.MemStats
			runtime.ReadMemStats(&m1)
			ctx := context.Background()
			lat, cpu := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for i := range b.N {
				t0, tc0 := time.Now(), threadTime()
				t, err := r.Pick(ctx, reqs[i%len(reqs)], router.PickOptions{RequestID: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				t.FirstToken(time.Time{})
				t.Done(200, response.Usage{}, time.Time{})
				lat, cpu = append(lat, time.Since(t0)), append(cpu, threadTime()-tc0)
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
			slices.Sort(lat)
			slices.Sort(cpu)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds()), "p50-cpu-us")
			b.ReportMetric(float64(cpu[len(cpu)*99/100].Microseconds()), "p99-cpu-us")
			b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(nw), "heap-B/worker")
		})
	}
}
