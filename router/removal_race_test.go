package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/workers"
)

// removingTokenizer changes the registry while Pick is between prepare (candidates
// read) and booking, the window the race lives in.
type removingTokenizer struct {
	reg  *workers.Registry
	keep []*workers.Worker // the registry's next contents
}

func (tk removingTokenizer) Tokenize(context.Context, *request.Request) (tokenize.Result, error) {
	tk.reg.Set(tk.keep)
	return tokenize.Result{Tokens: make([]uint32, 64), PromptTokens: 64, Path: tokenize.PathGiven}, nil
}

// firstPolicy always picks the first candidate (w0, candidates being sorted by name).
type firstPolicy struct{}

func (firstPolicy) Name() string { return "first" }
func (firstPolicy) Pick(*scoring.Input, []scoring.Candidate) scoring.Decision {
	return scoring.Decision{Index: 0, Reason: "first"}
}

// specIndex records Book calls and forgets a worker on RemoveWorker.
type specIndex struct {
	mu   sync.Mutex
	spec map[string]int
}

func (x *specIndex) Lookup(_ []kvindex.Key, dst []kvindex.Match) []kvindex.Match { return dst }
func (x *specIndex) Book(w string, keys []kvindex.Key) kvindex.Booking {
	x.mu.Lock()
	x.spec[w] += len(keys)
	x.mu.Unlock()
	return kvindex.Booking{}
}
func (x *specIndex) Withdraw(kvindex.Booking) int { return 0 }
func (x *specIndex) RemoveWorker(w string) {
	x.mu.Lock()
	delete(x.spec, w)
	x.mu.Unlock()
}

// A worker removed between prepare and booking is neither picked nor re-created in
// the router's state (flights, in-flight gauges, speculative index entries); when no
// candidate is left, Pick answers the no-healthy-worker 503.
func TestPickSkipsWorkerRemovedDuringPrepare(t *testing.T) {
	w0 := &workers.Worker{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}}
	w1 := &workers.Worker{Name: "w1", Address: "10.0.0.2:8000", Models: []string{"m"}}
	for _, c := range []struct {
		name string
		keep []*workers.Worker
		want string // picked worker; "" → 503
	}{
		{"one of two removed", []*workers.Worker{w1}, "w1"},
		{"the only one removed", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := workers.NewRegistry()
			reg.Set([]*workers.Worker{w0, w1})
			ms := metrics.NewUnregistered()
			idx := &specIndex{spec: map[string]int{}}
			r := New(Options{Registry: reg, Index: idx, Tokenizer: removingTokenizer{reg, c.keep},
				Policy: firstPolicy{}, Metrics: ms, Models: []Model{{Name: "m"}}})
			tk, err := r.Pick(context.Background(), chat, PickOptions{})
			if c.want == "" {
				var re *Error
				if !errors.As(err, &re) || re.Status != 503 || re.Message != `no healthy worker serves model "m"` {
					t.Fatalf("want the no-healthy-worker 503, got %v %v", tk, err)
				}
				if v := testutil.ToFloat64(ms.Router.Errors.WithLabelValues("no_worker")); v != 1 {
					t.Fatalf("errors{no_worker} = %v", v)
				}
			} else if err != nil || tk.Worker != c.want {
				t.Fatalf("picked %v (%v), want %s", tk, err, c.want)
			}
			r.mu.Lock()
			_, has := r.flights["w0"]
			r.mu.Unlock()
			if has {
				t.Fatal("flights[w0] re-created for a removed worker")
			}
			if n := testutil.CollectAndCount(ms.Router.InFlight); n > 1 || (n == 1 && c.want == "") {
				t.Fatalf("%d in-flight gauge series, want only the live worker's", n)
			}
			if testutil.ToFloat64(ms.Router.InFlight.WithLabelValues("w0")) != 0 {
				t.Fatal("in-flight gauge for removed w0")
			}
			idx.mu.Lock()
			_, spec0 := idx.spec["w0"]
			idx.mu.Unlock()
			if spec0 {
				t.Fatal("speculative index entries booked on removed w0")
			}
			if tk != nil {
				tk.Done(200, response.Usage{}, time.Time{})
			}
		})
	}
}
