package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/response"
)

// trackedBody feeds the response body to the Tracker as the ReverseProxy copies it.
type trackedBody struct {
	rc        io.ReadCloser
	f         *flight
	h         *handler
	tr        *response.Tracker
	status    int
	inference bool // an inference API: the body decides the outcome (response.Tracker.Result)
	ctx       context.Context
}

// Read completes the ticket at the end of the body: EOF, or the SSE end marker
// ([DONE], Anthropic message_stop) — after it nothing can change the result, and a
// client that hangs up right after it (the connection closes before the worker's
// EOF is read) was served, not gone.
func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.f.arm(b.h.opt.Proxy.UpstreamIdleTimeout)
	}
	if n > 0 && !b.f.Ended() && b.tr.Write(p[:n]) {
		b.f.Ticket.FirstToken(time.Time{})
		b.f.Route.Event("first_token", time.Time{})
	}
	switch {
	case err != nil && err != io.EOF && b.f.timedOut.Load():
		b.h.upstreamTimeout(b.f, "response body", b.h.opt.Proxy.UpstreamIdleTimeout)
	case err == io.EOF || (!b.f.Ended() && b.tr.Ended()):
		if !b.f.Ended() {
			b.f.Complete(b.tr.Result(b.status, b.inference), b.f.counted())
		}
	case err != nil:
		reason, o := "upstream_error", response.OutcomeUpstreamError
		if b.ctx.Err() != nil || errors.Is(err, context.Canceled) {
			reason, o = "client_gone", response.OutcomeAborted
		}
		b.h.abort(b.f, reason, o)
	}
	return n, err
}

// Close is called by the ReverseProxy when copying stops; a body not read to its end
// (client gone, write error) is an abort.
func (b *trackedBody) Close() error {
	err := b.rc.Close()
	b.h.abort(b.f, "client_gone", response.OutcomeAborted)
	return err
}

// strippedBody is the client's view of a tracked body from which the usage-only
// chunk kvroute asked for is removed.
type strippedBody struct {
	io.Reader
	io.Closer
}

// statusRecorder remembers the status for the metrics; Unwrap keeps Flush working
// through http.ResponseController (what ReverseProxy uses).
type statusRecorder struct {
	http.ResponseWriter
	status int
	// per-write deadline (Options.WriteTimeout): a client that stops reading is cut
	rc           *http.ResponseController
	writeTimeout time.Duration
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	if s.rc != nil {
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func statusClass(code int) string {
	if code == 0 {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}

// clientGone reports whether a body read failed because the client's connection
// ended mid-upload (it closed early: the body reader's io.ErrUnexpectedEOF; it reset
// the connection: ECONNRESET; the server closed it), not because of what it sent or a
// deadline (408).
func clientGone(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.EPIPE)
}
