package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Slowdown makes worker Worker (0-based) Factor times slower than its speed so far, At
// after the start of the run (kvbench --slow W:AT:F).
type Slowdown struct {
	Worker int
	At     time.Duration
	Factor float64
}

// ParseSpeeds parses a comma-separated list of positive speed factors ("1,1,2,3").
func ParseSpeeds(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("bench: worker speed %q: want a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// ParseSlowdown parses W:AT:F, e.g. "0:2m:3" (worker 0 three times slower from minute 2).
func ParseSlowdown(s string) (Slowdown, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Slowdown{}, fmt.Errorf("bench: slowdown %q: want WORKER:AT:FACTOR, e.g. 0:2m:3", s)
	}
	w, err1 := strconv.Atoi(parts[0])
	at, err2 := time.ParseDuration(parts[1])
	f, err3 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil || err3 != nil || w < 0 || at < 0 || !(f > 0) || math.IsInf(f, 0) {
		return Slowdown{}, fmt.Errorf("bench: slowdown %q: want WORKER (≥ 0):AT (duration ≥ 0):FACTOR (> 0)", s)
	}
	return Slowdown{Worker: w, At: at, Factor: f}, nil
}
