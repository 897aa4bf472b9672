package bench

import (
	"testing"
	"time"
)

// The burst compresses Factor × Duration of the timeline into Duration and shifts the
// rest back; later turns of a conversation keep their place relative to their first.
func TestFlashCrowdApply(t *testing.T) {
	f, err := ParseFlashCrowd("10s:5s:4")
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	w := &Workload{Items: []Item{{Conv: -1, At: 5 * s}, {Conv: -1, At: 14 * s}, {Conv: 0, At: 30 * s}, {Conv: 0, Turn: 1, At: 99 * s}, {Conv: -1, At: 40 * s}}}
	got := f.Apply(w)
	want := []time.Duration{5 * s, 11 * s, 15 * s, 99 * s, 25 * s}
	for i, it := range got.Items {
		if it.At != want[i] {
			t.Errorf("item %d at %v, want %v", i, it.At, want[i])
		}
	}
	if w.Items[1].At != 14*s {
		t.Fatal("Apply changed its input")
	}
	for _, bad := range []string{"", "1s:2s", "1s:0s:3", "1s:2s:0.5", "x:2s:3"} {
		if _, err := ParseFlashCrowd(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// Recovery is measured from the burst's end to the first window at the level before
// the burst (0.95 × it) from which the rest of the run holds it too.
func TestFlashRecovery(t *testing.T) {
	f := FlashCrowd{Start: 20 * time.Second, Duration: 10 * time.Second, Factor: 10}
	slo := time.Second
	var rs []Result
	add := func(at time.Duration, met bool) {
		r := Result{Start: at, TTFT: slo / 2}
		if !met {
			r.Err = "slo_miss"
		}
		rs = append(rs, r)
	}
	for s := 0; s < 60; s++ {
		at := time.Duration(s) * time.Second
		add(at, s < 20 || s >= 40)       // met before the burst and from 40 s on
		add(at+time.Millisecond, s < 20) // every second request misses after the start
		add(at+2*time.Millisecond, true) // noise-free majority
	}
	rep := Flash(rs, slo, f, 10*time.Second)
	if rep.Before != 1 || len(rep.Windows) != 6 {
		t.Fatalf("before %v windows %v", rep.Before, rep.Windows)
	}
	// windows from 20 s: 1/3 met, then 2/3 from 40 s: below 0.95 → never recovered
	if rep.RecoveryS != -1 {
		t.Fatalf("recovery %v, want -1 (never back to 0.95 × 1)", rep.RecoveryS)
	}
	rs = rs[:0]
	for s := 0; s < 60; s++ {
		add(time.Duration(s)*time.Second, s < 20 || s >= 40)
	}
	if rep = Flash(rs, slo, f, 10*time.Second); rep.RecoveryS != 10 {
		t.Fatalf("recovery %v s, want 10 (burst ends at 30 s, met again from 40 s): %v", rep.RecoveryS, rep.Windows)
	}
}
