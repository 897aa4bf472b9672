package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// echoHandler is --echo: a worker with zero engine time for load tests of kvroute
// itself (kvbench --load). POST /v1/chat/completions and /v1/completions read the whole
// body and answer at once: with "stream": true (a byte scan of the body, not a JSON
// parse, so the worker spends nothing per byte beyond reading it) an SSE stream of
// tokens content chunks, a usage chunk and [DONE], flushed immediately; otherwise one
// JSON completion. Every other path (/tokenize, /metrics, /health, /v1/models) is the
// simulated worker's, whose engine stays idle. Usage reports the body size / 4 as
// prompt tokens (no tokenization).
type echoHandler struct {
	next   http.Handler // the simulated worker
	model  string
	tokens int // content chunks per response
	seq    atomic.Uint64
}

const echoMaxBody = 64 << 20

func (e *echoHandler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || (r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/v1/completions") {
		e.next.ServeHTTP(rw, r)
		return
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(buf)
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(r.Body, echoMaxBody+1))
	if err != nil {
		http.Error(rw, `{"error":{"message":"body read failed","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
		return
	}
	if n > echoMaxBody {
		http.Error(rw, `{"error":{"message":"body too large","type":"BadRequestError","code":413}}`, http.StatusRequestEntityTooLarge)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	id := "echo-" + strconv.FormatUint(e.seq.Add(1), 10)
	prompt := int(n / 4)
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, e.tokens, prompt+e.tokens)
	obj, piece := "text_completion", `"text":"x"`
	if chat {
		obj, piece = "chat.completion", `"delta":{"content":"x"}`
	}
	if !streams(buf.Bytes()) {
		msg := `"text":"` + string(bytes.Repeat([]byte("x"), e.tokens)) + `"`
		if chat {
			msg = `"message":{"role":"assistant","content":"` + string(bytes.Repeat([]byte("x"), e.tokens)) + `"}`
		}
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":%q,"object":%q,"created":%d,"model":%q,"choices":[{"index":0,%s,"finish_reason":"length"}],"usage":%s}`,
			id, obj, time.Now().Unix(), e.model, msg, usage)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.Header().Set("Cache-Control", "no-cache")
	fl, _ := rw.(http.Flusher)
	var b bytes.Buffer
	for i := 0; i < e.tokens; i++ {
		fin := "null"
		if i == e.tokens-1 {
			fin = `"length"`
		}
		fmt.Fprintf(&b, "data: {\"id\":%q,\"object\":\"%s.chunk\",\"model\":%q,\"choices\":[{\"index\":0,%s,\"finish_reason\":%s}]}\n\n",
			id, obj, e.model, piece, fin)
		if i == 0 { // the first token goes out on its own: what TTFT measures
			_, _ = rw.Write(b.Bytes())
			b.Reset()
			if fl != nil {
				fl.Flush()
			}
		}
	}
	fmt.Fprintf(&b, "data: {\"id\":%q,\"object\":\"%s.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", id, obj, e.model, usage)
	_, _ = rw.Write(b.Bytes())
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// streams reports whether a JSON body sets "stream" to true, by a byte scan for the key
// followed by optional spaces and true (a key "stream" inside a string value is escaped
// as \"stream\" and does not match).
func streams(body []byte) bool {
	for {
		i := bytes.Index(body, []byte(`"stream"`))
		if i < 0 {
			return false
		}
		if i > 0 && body[i-1] == '\\' {
			body = body[i+8:]
			continue
		}
		rest := bytes.TrimLeft(body[i+8:], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			rest = bytes.TrimLeft(rest[1:], " \t\r\n")
			return bytes.HasPrefix(rest, []byte("true"))
		}
		body = body[i+8:]
	}
}
