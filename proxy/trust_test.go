package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/config"
)

// sendRaw writes an HTTP/1.1 request with headers hdr and a body of size bytes ("x"),
// Content-Length framed or chunked, all of it before reading the reply (as clients
// without Expect: 100-continue do), and returns the reply.
func sendRaw(t *testing.T, addr, path string, size int, chunked bool) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	framing := fmt.Sprintf("Content-Length: %d", size)
	if chunked {
		framing = "Transfer-Encoding: chunked"
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n\r\n", path, framing)
	chunk := []byte(strings.Repeat("x", 256<<10))
	_ = c.SetWriteDeadline(time.Now().Add(2 * time.Minute))
	for sent := 0; sent < size; sent += len(chunk) {
		b := chunk[:min(len(chunk), size-sent)]
		if chunked {
			_, err = fmt.Fprintf(c, "%x\r\n%s\r\n", len(b), b)
		} else {
			_, err = c.Write(b)
		}
		if err != nil {
			t.Fatalf("the connection broke after %d of %d body bytes: %v", sent, size, err)
		}
	}
	if chunked {
		io.WriteString(c, "0\r\n\r\n")
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A body far past the limit — past 64 MiB, where the drain used to stop and the socket
// was reset under a client still sending — gets its 413, in the request's API shape
// (OpenAI on /v1/chat/completions, Anthropic on /v1/messages), framed by
// Content-Length (refused from the header) or chunked (refused once limit+1 bytes
// arrived), and books no worker.
func TestOversizeFarPastLimitGets413InAPIShape(t *testing.T) {
	opt := Options{Config: config.Default().ExtProc, BodyTimeout: 2 * time.Minute, Proxy: config.Default().Proxy}
	opt.Config.MaxBodyBytes = 64 << 10
	opt.Proxy.Paths = append(opt.Proxy.Paths, "/v1/messages")
	srv, r, _, _ := proxyServer(t, opt, "127.0.0.1:1")
	addr := strings.TrimPrefix(srv.URL, "http://")
	const size = 72 << 20
	resp, body := sendRaw(t, addr, "/v1/chat/completions", size, false)
	if resp.StatusCode != 413 || !strings.Contains(body, `"error":{`) || !strings.Contains(body, "exceeds the limit") {
		t.Fatalf("OpenAI, Content-Length %d: %d %s", size, resp.StatusCode, body)
	}
	resp, body = sendRaw(t, addr, "/v1/messages", size, true)
	if resp.StatusCode != 413 || !strings.HasPrefix(body, `{"type":"error"`) || !strings.Contains(body, "exceeds the limit") {
		t.Fatalf("Anthropic, chunked %d: %d %s", size, resp.StatusCode, body)
	}
	if r.InFlight() != 0 {
		t.Fatal("an oversize body booked a worker")
	}
}

// A client that hangs up mid-upload is counted aborted with no response (code
// "error"), not as a 400 kvroute answered (rejected): an abort storm must read as
// clients leaving, not as malformed requests.
func TestClientGoneMidUploadCountsAborted(t *testing.T) {
	srv, r, _, ms := proxyServer(t, Options{BodyTimeout: time.Minute}, "127.0.0.1:1")
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n%s", `{"model":"m","messages":[`)
		if i == 2 { // a reset rather than a close
			c.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	}
	aborted := ms.ExtProc.ProxyRequests.WithLabelValues("error", "aborted")
	for deadline := time.Now().Add(time.Minute); testutil.ToFloat64(aborted) < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if v := testutil.ToFloat64(aborted); v != 3 {
		t.Fatalf("proxy_requests_total{error,aborted} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(ms.ExtProc.ProxyRequests.WithLabelValues("4xx", "rejected")); v != 0 {
		t.Fatalf("proxy_requests_total{4xx,rejected} = %v, want 0", v)
	}
	if r.InFlight() != 0 {
		t.Fatal("booked")
	}
	// A body that is merely malformed is still the client's 400.
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 || testutil.ToFloat64(ms.ExtProc.ProxyRequests.WithLabelValues("4xx", "rejected")) != 1 {
		t.Fatalf("malformed body: %d", resp.StatusCode)
	}
}

// Failed API keys are throttled per client address on the proxy: after
// admission.auth_throttle.failures unknown keys, the next request — even with the
// right key — is a 429 in the request's API shape with Retry-After and
// x-kvroute-rejected-reason: auth_throttled, before the key is looked up.
func TestProxyThrottlesFailedAPIKeys(t *testing.T) {
	keys := apiKeyFile(t, "sk-a", "alpha")
	srv, _, ms := admissionProxy(t, func(c *config.Admission) {
		c.Identity, c.APIKeysFile, c.RequireTenant = []string{"api_key"}, keys, true
		c.AuthThrottle = config.AuthThrottle{Failures: 2, Window: time.Minute, MaxClients: 100}
	})
	for i := 0; i < 2; i++ {
		if resp, body := admPost(t, srv.URL+"/v1/chat/completions", chatReq, map[string]string{"Authorization": "Bearer sk-guess"}); resp.StatusCode != 401 {
			t.Fatalf("guess %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := admPost(t, srv.URL+"/v1/chat/completions", chatReq, map[string]string{"Authorization": "Bearer sk-a"})
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(body, "failed API key attempts") ||
		resp.Header.Get("X-Kvroute-Rejected-Reason") != "auth_throttled" {
		t.Fatalf("after 2 failures: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, body = admPost(t, srv.URL+"/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-api-key": "sk-a"})
	if resp.StatusCode != 429 || !strings.HasPrefix(body, `{"type":"error"`) || resp.Header.Get("X-Kvroute-Rejected-Reason") != "auth_throttled" {
		t.Fatalf("Anthropic: %d %s", resp.StatusCode, body)
	}
	if v := testutil.ToFloat64(ms.Admission.AuthThrottled); v != 2 {
		t.Fatalf("auth_throttled_total = %v, want 2", v)
	}
}
