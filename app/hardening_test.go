package app

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
)

// runApp starts an App with proxy and admin listeners on loopback; it stops at cleanup.
func runApp(t *testing.T, cfg config.Config) (a *App, proxyAddr, adminAddr string) {
	t.Helper()
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl, al := testrun.Listen(t), testrun.Listen(t)
	testrun.Start(t, a, Listeners{Proxy: pl, Admin: al})
	return a, pl.Addr().String(), al.Addr().String()
}

// closedWithin reads from c until the server closes it (EOF or reset) and returns what
// was read; it fails the test if the connection is still open after bound.
func closedWithin(t *testing.T, c net.Conn, bound time.Duration) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %s (read so far %q)", bound, b)
	}
	return string(b)
}

// Issue 10 items 2 and 11: idle connections (before a request and between keep-alive
// requests), trickled headers and trickled bodies are closed by every HTTP server.
// Short timeouts are configured because this test is about the timeouts; the bound
// the test waits is generous (20 s) and never a speed assertion.
func TestHTTPServersCloseIdleAndTricklingConnections(t *testing.T) {
	cfg := config.Default()
	cfg.Server.HTTPReadHeaderTimeout = 300 * time.Millisecond
	cfg.Server.HTTPBodyTimeout = 300 * time.Millisecond
	cfg.Server.HTTPIdleTimeout = 300 * time.Millisecond
	_, proxyAddr, adminAddr := runApp(t, cfg)
	const bound = 20 * time.Second
	for _, srv := range []struct{ name, addr, path string }{{"proxy", proxyAddr, "/v1/chat/completions"}, {"admin", adminAddr, "/debug/explain"}} {
		dial := func(t *testing.T) net.Conn {
			c, err := net.Dial("tcp", srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		t.Run(srv.name+"/silent", func(t *testing.T) {
			closedWithin(t, dial(t), bound)
		})
		t.Run(srv.name+"/trickled headers", func(t *testing.T) {
			c := dial(t)
			io.WriteString(c, "POST "+srv.path+" HTTP/1.1\r\nHost: x\r\n")
			closedWithin(t, c, bound)
		})
		t.Run(srv.name+"/trickled body", func(t *testing.T) {
			c := dial(t)
			io.WriteString(c, "POST "+srv.path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\":")
			got := closedWithin(t, c, bound)
			if srv.name == "proxy" && !strings.Contains(got, " 408 ") {
				t.Errorf("the proxy answers a body that stops arriving with 408, got %q", got)
			}
		})
		t.Run(srv.name+"/idle keep-alive", func(t *testing.T) {
			c := dial(t)
			path := "/healthz"
			if srv.name == "proxy" {
				path = "/not-forwarded"
			}
			io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				t.Fatal("premise: the response must keep the connection alive")
			}
			_ = c.SetReadDeadline(time.Now().Add(bound))
			if _, err := br.ReadByte(); err == nil || (errors.As(err, new(net.Error)) && err.(net.Error).Timeout()) {
				t.Fatalf("idle keep-alive connection not closed: %v", err)
			}
		})
	}
}

// Issue 10 item 16: the admin port binds loopback by default; /debug/* takes an optional
// bearer token; /metrics and the probes stay open.
func TestAdminDebugToken(t *testing.T) {
	cfg := config.Default()
	cfg.Server.AdminToken = "s3cret"
	_, _, admin := runApp(t, cfg)
	get := func(path, auth string) int {
		req, _ := http.NewRequest("GET", "http://"+admin+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"/debug/workers", "/debug/index", "/debug/tokenize", "/debug/explain"} {
		if c := get(p, ""); c != http.StatusUnauthorized {
			t.Errorf("%s without token: %d, want 401", p, c)
		}
		if c := get(p, "Bearer wrong"); c != http.StatusUnauthorized {
			t.Errorf("%s wrong token: %d, want 401", p, c)
		}
		if c := get(p, "Bearer s3cret"); c == http.StatusUnauthorized {
			t.Errorf("%s right token refused", p)
		}
	}
	for _, p := range []string{"/metrics", "/healthz"} {
		if c := get(p, ""); c != http.StatusOK {
			t.Errorf("%s must stay open: %d", p, c)
		}
	}
	if config.Default().Server.AdminAddr != "127.0.0.1:9090" {
		t.Errorf("admin default must be loopback")
	}
}

// Issue 10 item 16: /debug/explain's body is capped by server.admin_explain_max_body_bytes
// and concurrent explains by server.admin_explain_concurrency.
func TestExplainCaps(t *testing.T) {
	cfg := config.Default()
	cfg.Server.AdminExplainMaxBodyBytes = 2048
	a, _, admin := runApp(t, cfg)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`
	req, _ := http.NewRequest("GET", "http://"+admin+"/debug/explain", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a 4 KiB body over a 2 KiB cap: %d, want 413", resp.StatusCode)
	}
	// Fill the semaphore as concurrent explains would; the next one is refused at once.
	for i := 0; i < cap(a.explainSem); i++ {
		a.explainSem <- struct{}{}
	}
	req, _ = http.NewRequest("GET", "http://"+admin+"/debug/explain", strings.NewReader(`{"model":"m","messages":[]}`))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("explain over the concurrency cap: %d, want 429", resp.StatusCode)
	}
}
