package response

import (
	"bytes"
	"io"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// UsageFilter removes, from an SSE response body handed to it in chunks, the usage-only
// chunk vLLM sends last when stream_options.include_usage is true — one event whose
// only line is `data: {...}` with "choices": [] and a non-null "usage"
// (vllm/entrypoints/openai/serving_chat.py and serving_completion.py) — and passes
// every other byte through unchanged, in order. kvroute asks for usage on a client's
// behalf (request.WithIncludeUsage); with the filter the client sees the stream the
// engine would have sent it without kvroute, while the Tracker, fed from the
// unfiltered body, still reads the usage. Both fronts use it: the proxy through
// UsageStripper (an io.Reader), the ext_proc server on each response body message.
//
// Events end with a blank line ("\n\n" or "\r\n\r\n", the terminators vLLM and
// sse-starlette write). An event is held until its terminator arrives (a client cannot
// act on part of one); an unterminated tail is passed through by Flush. A held event
// larger than MaxHeld bytes is passed through at once, unexamined (a usage chunk is a
// few hundred bytes), so memory stays bounded. The zero value is ready to use.
type UsageFilter struct {
	buf  []byte // received, not yet classified (starts at an event boundary)
	out  []byte // classified, to hand on
	pass bool   // the current event outgrew MaxHeld: pass it through to its end
}

// MaxHeld bounds the bytes of one event the filter holds while looking for its end.
const MaxHeld = 64 << 10

// Feed takes the next chunk of the body and returns the bytes to pass on now: every
// complete event so far except usage-only ones (possibly none, while an event is
// incomplete). The result is valid until the next call.
func (f *UsageFilter) Feed(chunk []byte) []byte {
	f.out = f.out[:0]
	f.buf = append(f.buf, chunk...)
	f.classify()
	return f.out
}

// Flush ends the body: it returns the unterminated tail held back (not an event the
// filter removes) and resets the filter.
func (f *UsageFilter) Flush() []byte {
	tail := f.buf
	f.buf, f.out, f.pass = nil, nil, false
	return tail
}

// UsageStripper is an io.Reader over an SSE response body that removes the usage-only
// chunk (UsageFilter).
type UsageStripper struct {
	src  io.Reader
	f    UsageFilter
	out  []byte // filtered, not yet returned
	err  error  // src's error, returned once out is drained
	done bool   // the tail was flushed
	rd   [32 << 10]byte
}

// NewUsageStripper returns a stripper reading from src.
func NewUsageStripper(src io.Reader) *UsageStripper { return &UsageStripper{src: src} }

// Read implements io.Reader. It returns src's error (io.EOF included) once everything
// before it was returned.
func (s *UsageStripper) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if !s.done { // an unterminated tail: not an event we remove
				s.done = true
				s.out = s.f.Flush()
				continue
			}
			return 0, s.err
		}
		n, err := s.src.Read(s.rd[:])
		s.out = append(s.out[:0], s.f.Feed(s.rd[:n])...)
		s.err = err
		if n == 0 && err == nil {
			return 0, nil
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// classify moves every complete event of buf to out, except usage-only ones.
func (f *UsageFilter) classify() {
	for len(f.buf) > 0 {
		end := eventEnd(f.buf)
		if f.pass {
			if end < 0 {
				f.out = append(f.out, f.buf...)
				f.buf = f.buf[:0]
				return
			}
			f.out, f.buf, f.pass = append(f.out, f.buf[:end]...), f.buf[end:], false
			continue
		}
		if end < 0 {
			if len(f.buf) > MaxHeld {
				f.pass = true
				continue
			}
			return
		}
		if ev := f.buf[:end]; !usageOnly(ev) {
			f.out = append(f.out, ev...)
		}
		f.buf = f.buf[end:]
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
