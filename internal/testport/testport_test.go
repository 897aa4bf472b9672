package testport

import (
	"fmt"
	"net"
	"testing"
)

func TestPortsLieOutsideTheEphemeralRange(t *testing.T) {
	first, last := ephemeralRange()
	seen := map[int]bool{}
	for _, p := range Free(t, 200) {
		if p >= first && p <= last {
			t.Fatalf("port %d inside the ephemeral range %d–%d", p, first, last)
		}
		if p < 1024 || p > 65535 {
			t.Fatalf("port %d out of range", p)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		l.Close()
	}
}

func TestConsecutiveSkipsATakenPort(t *testing.T) {
	base := Consecutive(t, 3)
	// Hold the port after the next run's first port so that run is refused; the run
	// Consecutive returns must be bindable as a whole and must not include it.
	mu.Lock()
	held := lo + next%size + 1
	mu.Unlock()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", held))
	if err != nil {
		t.Skipf("could not hold port %d: %v", held, err)
	}
	defer l.Close()
	got := Consecutive(t, 3)
	if held >= got && held < got+3 {
		t.Fatalf("run %d–%d includes held port %d", got, got+2, held)
	}
	if got >= base && got < base+3 {
		t.Fatalf("run %d overlaps the earlier run at %d", got, base)
	}
	if !bindable(got, 3) {
		t.Fatalf("run at %d not bindable", got)
	}
}
