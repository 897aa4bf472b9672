package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Arrivals says when open-loop items start.
type Arrivals struct {
	Kind    string  // "constant", "poisson", "streams", "trace"
	Rate    float64 // requests per second (constant, poisson)
	Streams int     // concurrent closed-loop streams (streams)
	Seed    uint64  // poisson, trace spread
	// Spread (trace): each arrival is delayed by a uniform draw in [0, Spread), seeded by
	// Seed; 0 keeps the trace's times. A trace whose timestamps are rounded (the Mooncake
	// conversation trace's are multiples of 3 s: ~9 requests share each instant at 1×)
	// replays its rounding as simultaneous bursts; Spread set to the rounding quantum
	// (÷ --speed) spreads them over it again.
	Spread time.Duration
}

// ParseArrivals parses "constant:R", "poisson:R", "streams:N", "trace" or "trace:D"
// (D a Go duration, Arrivals.Spread).
func ParseArrivals(s string, seed uint64) (Arrivals, error) {
	kind, arg, _ := strings.Cut(s, ":")
	a := Arrivals{Kind: kind, Seed: seed}
	var err error
	switch kind {
	case "constant", "poisson":
		a.Rate, err = strconv.ParseFloat(arg, 64)
		if err == nil && a.Rate <= 0 {
			err = fmt.Errorf("rate must be positive")
		}
	case "streams":
		a.Streams, err = strconv.Atoi(arg)
		if err == nil && a.Streams <= 0 {
			err = fmt.Errorf("streams must be positive")
		}
	case "trace":
		if arg != "" {
			a.Spread, err = time.ParseDuration(arg)
			if err == nil && a.Spread < 0 {
				err = fmt.Errorf("spread must not be negative")
			}
		}
	default:
		err = fmt.Errorf("unknown kind %q", kind)
	}
	if err != nil {
		return Arrivals{}, fmt.Errorf("bench: arrivals %q: %v (want constant:R, poisson:R, streams:N, trace or trace:SPREAD, e.g. trace:3s)", s, err)
	}
	return a, nil
}

func (a Arrivals) String() string {
	switch a.Kind {
	case "constant", "poisson":
		return fmt.Sprintf("%s:%g", a.Kind, a.Rate)
	case "streams":
		return fmt.Sprintf("streams:%d", a.Streams)
	case "trace":
		if a.Spread > 0 {
			return "trace:" + a.Spread.String()
		}
	}
	return a.Kind
}

// Apply returns a copy of w with At set for the first item of each conversation and
// every standalone item. "trace" keeps the workload's own At (plus a draw in
// [0, Spread) when Spread is set); "streams" leaves At
// zero (the runners start items as streams free up).
func (a Arrivals) Apply(w *Workload) *Workload {
	out := &Workload{Name: w.Name, Items: append([]Item(nil), w.Items...)}
	r := rand.New(rand.NewPCG(a.Seed, 0xa441))
	var t float64
	n := 0
	for i := range out.Items {
		it := &out.Items[i]
		if it.Conv >= 0 && it.Turn > 0 {
			continue
		}
		switch a.Kind {
		case "constant":
			t = float64(n) / a.Rate
		case "poisson":
			if n > 0 {
				t += -math.Log(1-r.Float64()) / a.Rate
			}
		case "trace":
			if a.Spread > 0 {
				it.At += time.Duration(r.Float64() * float64(a.Spread))
			}
			continue
		default:
			t = 0
		}
		it.At = time.Duration(t * float64(time.Second))
		n++
	}
	return out
}
