// Package testrun starts a long-running server (kvroute's app.App, or anything with
// the same Run/Ready shape) for a test and stops it at the test's end: the one helper
// behind "start an App on loopback listeners" in the app and e2e tests.
package testrun

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// Runner is what Start runs: Run serves on the listeners ls until ctx is cancelled and
// returns nil on a clean stop; Ready is closed once it serves. *app.App implements it
// with L = app.Listeners.
type Runner[L any] interface {
	Run(ctx context.Context, ls L) error
	Ready() <-chan struct{}
}

// StopTimeout bounds how long stop waits for Run to return after the cancel (a
// generous bound for a loaded CI machine: it only fails a test that would hang).
const StopTimeout = 30 * time.Second

// Start runs r.Run(ctx, ls) in a goroutine and waits until r is Ready. It fails the
// test at once when Run returns before Ready (a listener it cannot serve, a bad
// configuration). The returned stop cancels Run's context and waits for it to return,
// failing the test on Run's error or when it has not returned within StopTimeout; stop
// is idempotent and also runs at the test's cleanup.
func Start[L any](t testing.TB, r Runner[L], ls L) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ls) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(StopTimeout):
				t.Errorf("Run did not return within %s of the cancel", StopTimeout)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-r.Ready():
	case err := <-done:
		done <- err // for stop
		t.Fatalf("Run returned before it was ready: %v", err)
	}
	return stop
}

// Listen returns a TCP listener on 127.0.0.1 at a port the kernel picks, closed at the
// test's end (closing a listener a server already closed is harmless).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
