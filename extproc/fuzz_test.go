package extproc

import (
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fuzzBodies are the request/response bodies a fuzzed sequence draws from.
var fuzzBodies = []string{chatBody, "", `{"model":"m","prompt":[1,2,3],"max_tokens":1}`, `{"model":`, sse, "data: [DONE]\n\n", `{"model":"nope"}`}

// sequence decodes fuzz input into a stream: the first byte picks the request and
// response body modes (any value, out-of-enum ones included); each following byte one
// message: bits 0-2 the phase (6 and 7 repeat request headers, the most common
// duplicate), bit 3 end_of_stream, bits 4-6 the body.
func sequence(data []byte) []*extprocv3.ProcessingRequest {
	if len(data) == 0 {
		return nil
	}
	reqMode, respMode := procmodev3.ProcessingMode_BodySendMode(data[0]&7), procmodev3.ProcessingMode_BodySendMode(data[0]>>3&7)
	var out []*extprocv3.ProcessingRequest
	for i, b := range data[1:] {
		if i >= 64 {
			break
		}
		eos, bd := b&8 != 0, fuzzBodies[int(b>>4&7)%len(fuzzBodies)]
		var m *extprocv3.ProcessingRequest
		switch b & 7 {
		case 0, 6, 7:
			m = hdrs(eos, post("/v1/chat/completions")...)
		case 1:
			m = body(bd, eos)
		case 2:
			m = reqTrailers()
		case 3:
			m = rspHdrs(eos, ":status", "200", "content-type", "text/event-stream")
		case 4:
			m = rspBody(bd, eos)
		case 5:
			m = rspTrailers()
		}
		if len(out) == 0 {
			m = withPC(m, reqMode, respMode)
		}
		out = append(out, m)
	}
	return out
}

// FuzzMessageSequence sends random ext_proc message sequences (any phase order,
// duplicates, missing phases, any body mode) and checks the server's invariants: it
// never panics, every stream ends when Envoy half-closes it, and no booking outlives
// its stream.
func FuzzMessageSequence(f *testing.F) {
	for _, seed := range [][]byte{
		{byte(modeBuffered) | byte(modeStreamed)<<3, 0x00, 0x19, 0x03, 0x24, 0x3c},   // the normal BUFFERED request and SSE response
		{byte(modeFullDuplex) | byte(modeStreamed)<<3, 0x00, 0x11, 0x11, 0x02, 0x03}, // FULL_DUPLEX with trailers
		{byte(modeStreamed), 0x00, 0x01, 0x19, 0x0b},                                 // STREAMED, headers-only response
		{byte(modeBuffered), 0x00, 0x00, 0x19, 0x19},                                 // duplicate headers and bodies
		{byte(modeBuffered), 0x03, 0x04, 0x05},                                       // response phases only
		{0xff, 0x07, 0x1c, 0x02, 0x05},                                               // out-of-enum modes
		{byte(modeBufferedPartial), 0x00, 0x31, 0x0b, 0x4c},
	} {
		f.Add(seed)
	}
	h := newHarness(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs := sequence(data)
		if len(msgs) == 0 {
			return
		}
		s := h.open(t)
		recvDone := make(chan struct{})
		go func() {
			defer close(recvDone)
			for {
				if _, err := s.s.Recv(); err != nil {
					return
				}
			}
		}()
		for _, m := range msgs {
			if s.s.Send(m) != nil {
				break // the server ended the stream (an error reply, a limit)
			}
		}
		_ = s.s.CloseSend()
		select {
		case <-h.ended:
		case <-time.After(20 * time.Second):
			t.Fatal("the server stream did not end after Envoy half-closed it")
		}
		s.cancel()
		<-recvDone
		if n := h.router.InFlight(); n != 0 {
			t.Fatalf("%d bookings outlive their stream", n)
		}
		if p := testutil.ToFloat64(h.ms.ExtProc.Panics); p != 0 {
			t.Fatalf("the server panicked %v times", p)
		}
	})
}
