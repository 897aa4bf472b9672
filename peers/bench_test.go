package peers

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// benchSummary: 8 workers with open requests, each prefilling one new 4,000-token
// prefix (250 blocks of 16 tokens).
func benchSummary() *Summary {
	s := &Summary{Replica: "kvroute-7d9f8c6b5-x2kq9-1a2b3c", Incarnation: 1 << 62, Seq: 123456, Sent: time.Now()}
	for w := 0; w < 8; w++ {
		ws := WorkerSummary{Worker: fmt.Sprintf("vllm-%d", w), OldestPrefill: time.Now(),
			Booked: scoring.Booked{Requests: 12, Prefilling: 3, PrefillTokens: 12000, Decoding: 9}}
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
