package request

import "bytes"

// includeUsageMember is appended to a streamed request that names no stream_options.
var includeUsageMember = []byte(`,"stream_options":{"include_usage":true}`)

// WithIncludeUsage returns body with stream_options.include_usage set to true, and
// true, when r is a streamed OpenAI chat or completions request that names no
// stream_options: vLLM then ends the stream with one usage-only chunk
// (choices [], usage with prompt, completion and cached tokens;
// vllm/entrypoints/openai/serving_chat.py chat_completion_stream_generator), which the
// caller removes from the client's stream (response.UsageStripper). Otherwise body is
// returned unchanged with false: a client that set stream_options itself (null or
// include_usage false included) keeps what it asked for, and no key is ever duplicated. The member is inserted before the object's
// closing brace; every other byte of body is kept. body must be the JSON object r was
// parsed from.
func WithIncludeUsage(body []byte, r *Request) ([]byte, bool) {
	if r == nil || !r.Stream || r.HasStreamOptions || (r.API != APIChat && r.API != APICompletions) {
		return body, false
	}
	end := len(bytes.TrimRight(body, " \t\r\n"))
	if end == 0 || body[end-1] != '}' {
		return body, false
	}
	out := make([]byte, 0, len(body)+len(includeUsageMember))
	out = append(out, body[:end-1]...)
	out = append(out, includeUsageMember...)
	return append(out, body[end-1:]...), true
}
