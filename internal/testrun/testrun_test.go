package testrun

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

// server is a real HTTP server with app.App's Run/Ready shape.
type server struct {
	ready   chan struct{}
	failRun error // returned by Run at once, before Ready, when set
	stopErr error // returned by Run after the cancel
}

func (s *server) Ready() <-chan struct{} { return s.ready }

func (s *server) Run(ctx context.Context, ln net.Listener) error {
	if s.failRun != nil {
		return s.failRun
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }),
		ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	close(s.ready)
	<-ctx.Done()
	srv.Close()
	return s.stopErr
}

func TestStartServesUntilStop(t *testing.T) {
	ln := Listen(t)
	stop := Start[net.Listener](t, &server{ready: make(chan struct{})}, ln)
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d while running", resp.StatusCode)
	}
	stop()
	stop() // idempotent
	if _, err := http.Get("http://" + ln.Addr().String()); err == nil {
		t.Fatal("still serving after stop")
	}
}

// A Run that fails, before or after Ready, fails the test that started it.
func TestStartReportsRunErrors(t *testing.T) {
	for name, s := range map[string]*server{
		"before ready": {ready: make(chan struct{}), failRun: errors.New("listen: address in use")},
		"at stop":      {ready: make(chan struct{}), stopErr: errors.New("shutdown: grace exceeded")},
	} {
		t.Run(name, func(t *testing.T) {
			rec := &recorder{TB: t}
			func() {
				defer func() { recover() }() // Fatalf's Goexit stand-in below
				Start[net.Listener](rec, s, Listen(t))()
			}()
			if !rec.failed {
				t.Fatal("the Run error did not fail the test")
			}
		})
	}
}

// recorder notes failures instead of failing the enclosing test; Fatalf panics so the
// caller's deferred recover stands in for runtime.Goexit.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true; panic("fatal") }
func (r *recorder) Helper()               {}
