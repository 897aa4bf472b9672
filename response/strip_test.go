package response

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// What vLLM streams for a chat request with stream_options.include_usage (format of
// vllm/entrypoints/openai/serving_chat.py: model_dump_json(exclude_unset=True)), and
// the same stream without the option.
const (
	chunk1         = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	chunk2         = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n"
	usageOnlyChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\n"
	done           = "data: [DONE]\n\n"
)

func strip(t *testing.T, in string, wrap func(io.Reader) io.Reader) string {
	t.Helper()
	out, err := io.ReadAll(NewUsageStripper(wrap(strings.NewReader(in))))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestUsageStripperRemovesOnlyTheUsageChunk(t *testing.T) {
	with := chunk1 + chunk2 + usageOnlyChunk + done
	without := chunk1 + chunk2 + done
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"whole": func(r io.Reader) io.Reader { return r },
		"byte":  iotest.OneByteReader, // every event split at every position
		"half":  iotest.HalfReader,
	} {
		if got := strip(t, with, wrap); got != without {
			t.Fatalf("%s: got\n%q\nwant\n%q", name, got, without)
		}
		if got := strip(t, without, wrap); got != without {
			t.Fatalf("%s: a stream without the usage chunk changed:\n%q", name, got)
		}
	}
	crlf := strings.ReplaceAll(with, "\n\n", "\r\n\r\n")
	if got := strip(t, crlf, iotest.OneByteReader); got != strings.ReplaceAll(without, "\n\n", "\r\n\r\n") {
		t.Fatalf("CRLF terminators: %q", got)
	}
}

// Only a one-line data event whose choices are empty and whose usage is an object is
// removed: continuous usage stats on a content chunk, comments, multi-line events,
// malformed JSON and an unterminated tail pass through byte for byte.
func TestUsageStripperKeepsEverythingElse(t *testing.T) {
	keep := []string{
		`data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}}` + "\n\n",
		`data: {"choices":[],"usage":null}` + "\n\n",
		`data: {"choices":[]}` + "\n\n",
		": keep-alive\n\n",
		"event: x\n" + `data: {"choices":[],"usage":{}}` + "\n\n",
		`data: {"choices":[],"usage":{` + "\n\n",
		`data: [DONE]` + "\n\n",
		`data: {"choices":[],"usage":{"prompt_tokens":1}}`, // no terminator: not an event we remove
	}
	in := strings.Join(keep, "")
	if got := strip(t, in, iotest.OneByteReader); got != in {
		t.Fatalf("got\n%q\nwant\n%q", got, in)
	}
}

// An event that grows past MaxHeld without ending is passed through as it comes, so
// the stripper's memory stays bounded; it is never removed.
func TestUsageStripperBoundsWhatItHolds(t *testing.T) {
	big := "data: " + strings.Repeat("x", 3*MaxHeld) + "\n\n"
	in := big + usageOnlyChunk + done
	s := NewUsageStripper(iotest.HalfReader(strings.NewReader(in)))
	var out bytes.Buffer
	buf := make([]byte, 1024)
	for {
		n, err := s.Read(buf)
		out.Write(buf[:n])
		if len(s.f.buf) > MaxHeld+len(s.rd) {
			t.Fatalf("holding %d bytes", len(s.f.buf))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if out.String() != big+done {
		t.Fatalf("big event changed or usage kept: %d bytes out", out.Len())
	}
}

// The chunk API the ext_proc server uses: the body cut at every pair of positions,
// each piece fed in turn, gives the stripped stream; what Feed holds back comes out of
// a later Feed or of Flush (an unterminated tail), in order.
func TestUsageFilterChunks(t *testing.T) {
	with := chunk1 + usageOnlyChunk + done + "data: tail"
	want := chunk1 + done + "data: tail"
	for i := 0; i <= len(with); i += 7 {
		for j := i; j <= len(with); j += 11 {
			var f UsageFilter
			var out []byte
			for _, piece := range []string{with[:i], with[i:j], with[j:]} {
				out = append(out, f.Feed([]byte(piece))...)
			}
			out = append(out, f.Flush()...)
			if string(out) != want {
				t.Fatalf("cut at %d, %d: %q", i, j, out)
			}
		}
	}
	var f UsageFilter
	if got := f.Feed([]byte(chunk1[:10])); len(got) != 0 {
		t.Fatalf("part of an event passed on: %q", got)
	}
	if got := string(f.Feed([]byte(chunk1[10:] + usageOnlyChunk[:5]))); got != chunk1 {
		t.Fatalf("completed event: %q", got)
	}
	if got := string(f.Feed([]byte(usageOnlyChunk[5:]))); got != "" {
		t.Fatalf("usage chunk passed on: %q", got)
	}
}
