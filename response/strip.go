package response

import (
	"bytes"
	"io"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// UsageStripper is an io.Reader over an SSE response body that removes the usage-only
// chunk vLLM sends last when stream_options.include_usage is true — one event whose
// only line is `data: {...}` with "choices": [] and a non-null "usage"
// (vllm/entrypoints/openai/serving_chat.py and serving_completion.py) — and passes
// every other byte through unchanged, in order. kvroute asks for usage on a client's
// behalf (request.WithIncludeUsage); with the stripper the client sees the stream the
// engine would have sent it without kvroute, while the Tracker, fed from the
// unstripped body, still reads the usage.
//
// Events end with a blank line ("\n\n" or "\r\n\r\n", the terminators vLLM and
// sse-starlette write). An event is held until its terminator arrives (a client cannot
// act on part of one); an unterminated tail is passed through at EOF. A held event
// larger than MaxHeld bytes is passed through at once, unexamined (a usage chunk is a
// few hundred bytes), so memory stays bounded.
type UsageStripper struct {
	src  io.Reader
	buf  []byte // read from src, not yet classified (starts at an event boundary)
	out  []byte // classified, to hand to the caller
	err  error  // src's error, returned once out is drained
	pass bool   // the current event outgrew MaxHeld: pass it through to its end
	rd   [32 << 10]byte
}

// MaxHeld bounds the bytes of one event the stripper holds while looking for its end.
const MaxHeld = 64 << 10

// NewUsageStripper returns a stripper reading from src.
func NewUsageStripper(src io.Reader) *UsageStripper { return &UsageStripper{src: src} }

// Read implements io.Reader. It returns src's error (io.EOF included) once everything
// before it was returned.
func (s *UsageStripper) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if len(s.buf) > 0 { // an unterminated tail: not an event we remove
				s.out, s.buf = s.buf, nil
				continue
			}
			return 0, s.err
		}
		n, err := s.src.Read(s.rd[:])
		s.buf = append(s.buf, s.rd[:n]...)
		s.err = err
		s.classify()
		if n == 0 && err == nil {
			return 0, nil
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = nil
	}
	return n, nil
}

// classify moves every complete event of buf to out, except usage-only ones.
func (s *UsageStripper) classify() {
	for len(s.buf) > 0 {
		end := eventEnd(s.buf)
		if s.pass {
			if end < 0 {
				s.out = append(s.out, s.buf...)
				s.buf = s.buf[:0]
				return
			}
			s.out, s.buf, s.pass = append(s.out, s.buf[:end]...), s.buf[end:], false
			continue
		}
		if end < 0 {
			if len(s.buf) > MaxHeld {
				s.pass = true
				continue
			}
			return
		}
		if ev := s.buf[:end]; !usageOnly(ev) {
			s.out = append(s.out, ev...)
		}
		s.buf = s.buf[end:]
	}
}

// eventEnd is the length of buf's first event with its terminator, or -1.
func eventEnd(buf []byte) int {
	i, j := bytes.Index(buf, []byte("\n\n")), bytes.Index(buf, []byte("\r\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j >= 0 && (i < 0 || j < i):
		return j + 4
	}
	return i + 2
}

// usageOnly reports whether ev (with its terminator) is one `data:` line holding a
// JSON object with "choices": [] and a non-null "usage".
func usageOnly(ev []byte) bool {
	line := bytes.TrimRight(ev, "\r\n")
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || bytes.ContainsAny(data, "\r\n") || len(data) > MaxHeld {
		return false
	}
	v, err := jsonvalue.ParseValue(bytes.TrimSpace(data))
	if err != nil || v.Kind() != jsonvalue.Object {
		return false
	}
	ch, ok := v.Get("choices")
	if !ok || ch.Kind() != jsonvalue.Array || ch.Len() != 0 {
		return false
	}
	u, ok := v.Get("usage")
	return ok && u.Kind() == jsonvalue.Object
}
