// Command envoy-standin serves the e2e package's Envoy stand-in (HTTP listener →
// ext_proc filter → ORIGINAL_DST router, imitated in Go) on a loopback port, for load
// tests of `kvroute serve` where no Envoy binary is available (make loadtest). It is a
// test harness, not a proxy to deploy: use Envoy itself in front of kvroute serve.
//
//	envoy-standin --listen 127.0.0.1:10000 --ext-proc 127.0.0.1:9002 --request-body buffered
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/e2e"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "envoy-standin:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("envoy-standin", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:10000", "downstream HTTP listener (loopback)")
	extProc := fs.String("ext-proc", "127.0.0.1:9002", "kvroute serve's ext_proc gRPC address")
	reqBody := fs.String("request-body", "buffered", "request_body_mode: buffered or streamed")
	msgTimeout := fs.Duration("message-timeout", 10*time.Second, "ext_proc message_timeout")
	limit := fs.Int("buffer-limit", 16<<20, "buffer limit, bytes (Envoy's per_connection_buffer_limit_bytes)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	mode := e2e.Buffered
	switch *reqBody {
	case "buffered":
	case "streamed":
		mode = e2e.Streamed
	default:
		return fmt.Errorf("--request-body must be buffered or streamed, got %q", *reqBody)
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: the stand-in only listens on loopback", *listen)
	}
	env, err := e2e.New(e2e.Config{ExtProcAddr: *extProc, RequestBodyMode: mode, ResponseBodyMode: e2e.Streamed,
		MessageTimeout: *msgTimeout, BufferLimit: *limit})
	if err != nil {
		return err
	}
	defer env.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: env, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		_ = srv.Close()
	}()
	slog.Info("envoy stand-in ready", "listen", ln.Addr().String(), "ext_proc", *extProc, "request_body", *reqBody)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
