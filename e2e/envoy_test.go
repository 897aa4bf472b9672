package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/response"
)

// Every request body mode Envoy may be configured with, streamed chat answer: the
// stand-in sends each mode's message sequence (reference §2.2–2.6), routes by the
// destination header like ORIGINAL_DST (§5.3), and the worker must receive the body
// byte for byte, with content-length only where Envoy keeps it (§4.4).
func TestEveryRequestBodyMode(t *testing.T) {
	for _, c := range []struct {
		name     string
		req, rsp Mode
		keepsCL  bool
		noProto  bool
	}{
		{"NONE", None, Streamed, true, false},
		{"STREAMED", Streamed, Streamed, false, false},
		{"BUFFERED", Buffered, Streamed, true, false},
		{"BUFFERED/no protocol_config", Buffered, Streamed, true, true},
		{"BUFFERED_PARTIAL", BufferedPartial, Streamed, false, false},
		{"FULL_DUPLEX_STREAMED", FullDuplex, FullDuplex, false, false},
		{"BUFFERED/response BUFFERED", Buffered, Buffered, true, false},
		{"BUFFERED/response NONE", Buffered, None, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: c.req, ResponseBodyMode: c.rsp, NoProtocolConfig: c.noProto}})
			st, h, body := f.do("POST", "/v1/chat/completions", chatStream, "X-Gateway-Destination-Endpoint", "6.6.6.6:1")
			if st != 200 || !strings.Contains(body, `"Hello"`) || !strings.Contains(body, "[DONE]") {
				t.Fatalf("status %d body %q", st, body)
			}
			var w *testWorker
			for _, x := range f.workers {
				if x.name == h.Get("X-Served-By") {
					w = x
				}
			}
			if w == nil {
				t.Fatalf("no worker served the request (headers %v)", h)
			}
			wh, wb := w.last()
			if string(wb) != chatStream {
				t.Fatalf("worker got body %q, want it byte for byte", wb)
			}
			if d := wh.Get("X-Gateway-Destination-Endpoint"); d != w.addr() {
				t.Fatalf("destination header at worker = %q, want %q (client value overwritten)", d, w.addr())
			}
			if c.keepsCL && w.lastCL() != int64(len(chatStream)) {
				t.Fatalf("content-length must be kept in %s (PS shouldRemoveContentLength)", c.name)
			} else if !c.keepsCL && w.lastCL() > 0 {
				t.Fatalf("content-length must be removed in %s (§4.4), worker saw %d", c.name, w.lastCL())
			}
			if n := f.inFlight(); n != 0 {
				t.Fatalf("in flight after the response = %d, want 0", n)
			}
			m := f.app.Metrics.Router.TicketsReleased
			if c.rsp != None && testutil.ToFloat64(m.WithLabelValues("first_token")) != 1 {
				t.Fatal("first token must be observed from the SSE body")
			}
			if testutil.ToFloat64(m.WithLabelValues("done")) != 1 {
				t.Fatal("completion must be observed")
			}
		})
	}
}

// Headers-only requests (end_of_stream on headers, PS no_body_): a non-inference path
// gets a load-only pick and is routed.
func TestHeadersOnlyRequest(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}})
	st, h, body := f.do("GET", "/v1/models", "")
	if st != 200 || h.Get("X-Served-By") == "" || !strings.Contains(body, `"object":"list"`) {
		t.Fatalf("status %d body %q", st, body)
	}
	if f.inFlight() != 0 {
		t.Fatal("ticket leaked")
	}
}

// Chunked request bodies in small codec slices: STREAMED pipelines every chunk (CC
// handleDataStreamedMode) and FULL_DUPLEX echoes them (PS
// handleDuplexStreamedBodyResponse); the worker sees the same bytes.
func TestChunkedBodies(t *testing.T) {
	for _, mode := range []Mode{Streamed, FullDuplex, BufferedPartial} {
		t.Run(mode.String(), func(t *testing.T) {
			rsp := Streamed
			if mode == FullDuplex {
				rsp = FullDuplex
			}
			f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: mode, ResponseBodyMode: rsp, ChunkSize: 7, BufferLimit: 4096}})
			pr, pw := io.Pipe()
			go func() {
				for i := 0; i < len(chatStream); i += 11 {
					pw.Write([]byte(chatStream[i:min(i+11, len(chatStream))]))
				}
				pw.Close()
			}()
			req, _ := http.NewRequest("POST", f.url+"/v1/chat/completions", pr) // no length: chunked
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
				t.Fatalf("status %d body %q", resp.StatusCode, b)
			}
			got := false
			for _, w := range f.workers {
				if _, wb := w.last(); string(wb) == chatStream {
					got = true
				}
			}
			if !got {
				t.Fatal("no worker received the body intact")
			}
			if f.envoy.Stats().Messages < 10 {
				t.Fatalf("only %d ext_proc messages: chunks were not sent separately", f.envoy.Stats().Messages)
			}
		})
	}
}

// Refusals: ImmediateResponse with the OpenAI error JSON (front.ErrorReply), delivered
// by the stand-in as Envoy's local reply (CC sendImmediateResponse).
func TestRefusals(t *testing.T) {
	for _, mode := range []Mode{Buffered, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			rsp := Streamed
			if mode == FullDuplex {
				rsp = FullDuplex
			}
			f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: mode, ResponseBodyMode: rsp},
				cfg: func(c *config.Config) {
					c.ExtProc.MaxBodyBytes = 4096
					c.Scoring.Scrape.Interval = 0 // health is set by hand below; a scrape would restore it
				}})
			st, h, body := f.do("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("x", 5000)+`"}]}`)
			checkOpenAIError(t, st, h, body, 413, "invalid_request_error")
			st, h, body = f.do("POST", "/v1/chat/completions", `{"model":"m","messages":[`)
			checkOpenAIError(t, st, h, body, 400, "invalid_request_error")
			st, h, body = f.do("POST", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`)
			checkOpenAIError(t, st, h, body, 404, "NotFoundError")
			st, h, body = f.do("POST", "/v1/completions", `{"model":"m"}`)
			checkOpenAIError(t, st, h, body, 400, "invalid_request_error")
			for _, w := range f.workers {
				f.app.Registry.SetHealthy(w.name, false)
			}
			st, h, body = f.do("POST", "/v1/chat/completions", chatNonStream)
			checkOpenAIError(t, st, h, body, 503, "service_unavailable")
			for _, w := range f.workers {
				if w.hits.Load() != 0 {
					t.Fatal("a refused request reached a worker")
				}
			}
			if f.inFlight() != 0 {
				t.Fatal("refusals must not book")
			}
		})
	}
}

// Each API shape, streamed and not: chat, completions (string, list, token ids, list
// of token-id lists), Anthropic messages.
func TestAPIShapes(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}})
	cases := []struct{ path, body string }{
		{"/v1/chat/completions", chatNonStream},
		{"/v1/chat/completions", chatStream},
		{"/v1/completions", `{"model":"m","prompt":"once upon","max_tokens":4}`},
		{"/v1/completions", `{"model":"m","prompt":["a","b"],"stream":true}`},
		{"/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18],"stream":true}`},
		{"/v1/completions", `{"model":"m","prompt":[[1,2,3],[4,5,6]]}`},
		{"/v1/messages", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":16,"stream":true,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`},
	}
	streams := 0
	for _, c := range cases {
		st, _, body := f.do("POST", c.path, c.body)
		if st != 200 || !strings.Contains(body, "Hello") {
			t.Fatalf("%s %s: status %d body %q", c.path, c.body, st, body)
		}
		if strings.Contains(c.body, `"stream":true`) {
			streams++
		}
	}
	m := f.app.Metrics.Router.TicketsReleased
	if got := testutil.ToFloat64(m.WithLabelValues("first_token")); int(got) != streams {
		t.Fatalf("first tokens observed = %v, want %d (one per streamed answer)", got, streams)
	}
	if got := testutil.ToFloat64(m.WithLabelValues("done")); int(got) != len(cases) {
		t.Fatalf("completions = %v, want %d", got, len(cases))
	}
}

// Upstream 5xx: the worker's answer passes through; the ticket completes (Done with
// the status), nothing leaks.
func TestUpstream5xx(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed},
		setup: func(ws []*testWorker) {
			for _, w := range ws {
				w.status.Store(500)
			}
		}})
	st, _, body := f.do("POST", "/v1/chat/completions", chatStream)
	if st != 500 || !strings.Contains(body, "worker failure") {
		t.Fatalf("status %d body %q", st, body)
	}
	if f.inFlight() != 0 || testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("done")) != 1 {
		t.Fatal("a 5xx answer completes the ticket")
	}
}

// Client disconnect mid-stream: Envoy sends no special message; it destroys the filter
// and resets the side stream (CC onDestroy; GC close()). kvroute must abort the ticket:
// the in-flight count returns to zero.
//
// With runtime ext_proc_graceful_grpc_close Envoy half-closes instead (the server sees
// EOF, GC halfCloseAndDeleteOnRemoteClose): same outcome, abort reason "closed".
func TestClientDisconnectMidStream(t *testing.T) {
	for _, c := range []struct {
		mode     Mode
		graceful bool
		reason   string
	}{{Streamed, false, "cancelled"}, {FullDuplex, false, "cancelled"}, {Streamed, true, "closed"}} {
		mode := c.mode
		t.Run(fmt.Sprintf("%s/graceful=%v", mode, c.graceful), func(t *testing.T) {
			gate := make(chan struct{})
			f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: mode, ResponseBodyMode: mode, GracefulClose: c.graceful},
				setup: func(ws []*testWorker) {
					for _, w := range ws {
						w.gate = gate
					}
				}})
			defer close(gate)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/chat/completions", strings.NewReader(chatStream))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			rd := bufio.NewReader(resp.Body)
			for {
				line, err := rd.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(line, `"Hello"`) {
					break
				}
			}
			if n := f.inFlight(); n != 1 {
				t.Fatalf("in flight mid-stream = %d, want 1", n)
			}
			cancel()
			resp.Body.Close()
			f.waitInFlight(0)
			if got := testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("abort")); got != 1 {
				t.Fatalf("aborts = %v, want 1", got)
			}
			// Envoy's default close is END_STREAM then RST_STREAM at once: the server may
			// read either first, so "cancelled" or "closed"; graceful close is always "closed".
			// The stream counts its abort just after it releases the ticket (extproc
			// stream.finish): wait for the count rather than read it at release.
			ab := f.app.Metrics.ExtProc.Aborts
			aborts := func() float64 {
				got := testutil.ToFloat64(ab.WithLabelValues("closed"))
				if !c.graceful {
					got += testutil.ToFloat64(ab.WithLabelValues("cancelled"))
				}
				return got
			}
			for deadline := time.Now().Add(30 * time.Second); aborts() < 1 && time.Now().Before(deadline); {
				time.Sleep(2 * time.Millisecond)
			}
			if got := aborts(); got != 1 {
				t.Fatalf("aborts_total{reason=%s} = %v, want 1", c.reason, got)
			}
		})
	}
}

// A burst of 100 identical concurrent requests: each pick is booked under the lock
// that made it, so later picks see earlier bookings and the burst spreads by load.
func TestBurstSpreadsByLoad(t *testing.T) {
	burstSpreadsByLoad(t, fixtureOpts{workers: 4, envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, MessageTimeout: 10 * time.Second}}, 100)
}

// Ticket expiry: a response that never finishes is released by the sweep after
// router.ticket_ttl; its late completion must not release anything twice.
func TestTicketExpiry(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, MessageTimeout: 5 * time.Second},
		cfg: func(c *config.Config) { c.Router.TicketTTL = time.Second },
		setup: func(ws []*testWorker) {
			for _, w := range ws {
				w.gate = gate
			}
		}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		st, _, _ := f.do("POST", "/v1/chat/completions", chatStream)
		if st != 200 {
			t.Errorf("status %d", st)
		}
	}()
	f.waitInFlight(1)
	time.Sleep(1100 * time.Millisecond) // let the ticket age past the 1 s TTL (minimum allowed)
	f.app.Router.Sweep()                // kvroute's own sweeper (every 1 s here) may have released it already
	if f.inFlight() != 0 {
		t.Fatal("expired ticket still in flight")
	}
	close(gate)
	<-done
	ws, _ := f.app.Router.Snapshot()
	for _, w := range ws {
		if w.Booked.Requests != 0 || w.Booked.Prefilling != 0 || w.Booked.Decoding != 0 {
			t.Fatalf("bookings %+v after a late completion of an expired ticket: released twice", w.Booked)
		}
	}
	if got := testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("expired")); got != 1 {
		t.Fatalf("expired = %v", got)
	}
	f.waitOutcome(response.OutcomeExpired, 1) // the late completion is counted with the outcome the router recorded
}

// Response trailers (trailer mode SEND, upstream sends HTTP trailers): the body chunks
// keep end_of_stream=false and the trailers message completes the ticket (PS
// finalizeBodyResponse; GIE PR #2510).
func TestResponseTrailers(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, ResponseTrailers: true},
		setup: func(ws []*testWorker) {
			for _, w := range ws {
				w.trailer = true
			}
		}})
	st, _, body := f.do("POST", "/v1/chat/completions", chatStream)
	if st != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("status %d body %q", st, body)
	}
	if f.inFlight() != 0 || testutil.ToFloat64(f.app.Metrics.Router.TicketsReleased.WithLabelValues("done")) != 1 {
		t.Fatal("trailers must complete the ticket")
	}
}

// Optional response headers and routing by metadata (OD metadata_key precedes the
// header) with the optional worker/predicted-TTFT headers added on the response.
func TestMetadataRoutingAndResponseHeaders(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed, MetadataKey: true},
		cfg: func(c *config.Config) {
			c.ExtProc.WorkerHeader = "x-kvroute-worker"
			c.ExtProc.PredictedTTFTHeader = "x-kvroute-predicted-ttft-ms"
		}})
	st, h, _ := f.do("POST", "/v1/chat/completions", chatNonStream)
	if st != 200 || h.Get("X-Kvroute-Worker") != h.Get("X-Served-By") || h.Get("X-Kvroute-Predicted-Ttft-Ms") == "" {
		t.Fatalf("status %d headers %v", st, h)
	}
}

// BUFFERED_PARTIAL with a body larger than the buffer limit: Envoy sends what it queued
// (end_of_stream=false) as one message and passes the rest through unprocessed (CC
// handleDataBufferedPartialMode). kvroute cannot parse a cut body: it sniffs the model
// and picks on load; the worker still gets every byte.
func TestBufferedPartialCutBody(t *testing.T) {
	f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: BufferedPartial, ResponseBodyMode: Streamed, BufferLimit: 64}})
	st, h, body := f.do("POST", "/v1/chat/completions", chatStream)
	if st != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("status %d body %q", st, body)
	}
	for _, w := range f.workers {
		if w.name == h.Get("X-Served-By") {
			if _, wb := w.last(); string(wb) != chatStream {
				t.Fatalf("worker got %q", wb)
			}
			return
		}
	}
	t.Fatal("no worker served the request")
}
