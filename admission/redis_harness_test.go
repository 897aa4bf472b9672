package admission

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/config"
)

// redisServer is a real redis-server on a free loopback port, with a temp dir and no
// persistence, killed when the test ends.
type redisServer struct {
	Addr string
	cmd  *exec.Cmd
	out  *bytes.Buffer
	opt  redisServerOptions
}

// redisServerOptions adjust startRedisWith's server.
type redisServerOptions struct {
	Password string // requirepass: clients AUTH with it
	// TLS: serve TLS only (--port 0 --tls-port) with these PEM files; nil: plaintext
	TLS *redisTLSFiles
}

type redisTLSFiles struct{ Cert, Key, CA string }

// startRedis starts redis-server (Debian package redis-server; scripts/deps.sh
// installs it). Without it the test is skipped, unless CI is set: then it fails.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	return startRedisWith(t, redisServerOptions{})
}

// startRedisWith is startRedis with a password and/or TLS.
func startRedisWith(t testing.TB, o redisServerOptions) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI: redis-server required (scripts/deps.sh installs it)")
		}
		t.Skip("redis-server not installed (scripts/deps.sh installs it; `apt-get install redis-server`): skipping the redis backend tests")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &redisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), out: &bytes.Buffer{}, opt: o}
	s.start(t, bin, port)
	return s
}

func (s *redisServer) start(t testing.TB, bin string, port int) {
	t.Helper()
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--daemonize", "no"}
	copt := &redis.Options{Addr: s.Addr, MaxRetries: -1, Password: s.opt.Password}
	if s.opt.Password != "" {
		args = append(args, "--requirepass", s.opt.Password)
	}
	if f := s.opt.TLS; f != nil {
		args[1] = "0"
		args = append(args, "--tls-port", strconv.Itoa(port), "--tls-cert-file", f.Cert, "--tls-key-file", f.Key,
			"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no")
		tc, err := RedisTLSConfig(config.RedisTLS{Enabled: true, CAFile: f.CA})
		if err != nil {
			t.Fatal(err)
		}
		copt.TLSConfig = tc
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := s.cmd
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(copt)
	defer c.Close()
	// Readiness, not speed: poll until it answers (generous bound for a loaded CI box).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer: %v\n%s", s.Addr, err, s.out)
		}
	}
}

// kill stops the server (SIGKILL: no clean shutdown) and waits for it to exit.
func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// restart starts it again on the same port (empty: no persistence).
func (s *redisServer) restart(t testing.TB) {
	bin, _ := exec.LookPath("redis-server")
	_, p, _ := net.SplitHostPort(s.Addr)
	port, _ := strconv.Atoi(p)
	s.start(t, bin, port)
}
