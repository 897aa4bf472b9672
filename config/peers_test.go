package config

import (
	"strings"
	"testing"
	"time"
)

func TestPeersKeysLoad(t *testing.T) {
	p := writeFile(t, `
peers:
  listen_addr: "127.0.0.1:9004"
  static: ["127.0.0.1:9104", "127.0.0.1:9204"]
  silence_timeout: 2s
`)
	fs := Flags("test")
	if err := fs.Parse([]string{"--config", p, "--peers.interval=40ms"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(fs, env(map[string]string{"KVROUTE_PEERS_ID": "kvroute-0"}))
	if err != nil {
		t.Fatal(err)
	}
	pc := c.Peers
	if !pc.Enabled() || len(pc.Static) != 2 || pc.Static[1] != "127.0.0.1:9204" || pc.SilenceTimeout != 2*time.Second ||
		pc.Interval != 40*time.Millisecond || pc.ID != "kvroute-0" || pc.MaxPeers != 64 {
		t.Fatalf("peers keys from file, flag, env and defaults: %+v", pc)
	}
}

func TestPeersValidation(t *testing.T) {
	for _, tc := range []struct {
		name, key, says string
		mod             func(*Config)
	}{
		{"bind mode", "index.bind_endpoint", "a vLLM publisher connects to one endpoint", func(c *Config) {
			c.Peers.ListenAddr, c.Index.BindEndpoint = "127.0.0.1:9004", "tcp://*:5557"
		}},
		{"static without listen", "peers.listen_addr", "is required", func(c *Config) { c.Peers.Static = []string{"127.0.0.1:9004"} }},
		{"bad static", "peers.static[0]", "host:port", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.Static = "127.0.0.1:9004", []string{"nope"}
		}},
		{"dns without name", "peers.dns.name", "requires", func(c *Config) { c.Peers.ListenAddr, c.Peers.Discovery = ":9004", "dns" }},
		{"unknown discovery", "peers.discovery", "unknown", func(c *Config) { c.Peers.ListenAddr, c.Peers.Discovery = ":9004", "gossip" }},
		{"silence vs interval", "peers.silence_timeout", "4 × peers.interval", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.SilenceTimeout = ":9004", 50*time.Millisecond
		}},
		{"max peers", "peers.max_peers", "1..1024", func(c *Config) { c.Peers.ListenAddr, c.Peers.MaxPeers = ":9004", 0 }},
		{"inbound below one message", "peers.max_inbound_bytes", "peers.max_message_bytes", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.MaxInboundBytes = "127.0.0.1:9004", 1<<20
		}},
		{"max requests per worker", "peers.max_requests_per_worker", "1..1048576", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.MaxRequestsPerWorker = "127.0.0.1:9004", 0
		}},
		// Safe by default: a port other hosts reach, with nothing to authenticate peers.
		{"every interface, no auth", "peers.listen_addr", "peers.insecure: true", func(c *Config) { c.Peers.ListenAddr = ":9004" }},
		{"pod IP, no auth", "peers.listen_addr", "not authenticated", func(c *Config) { c.Peers.ListenAddr = "10.0.0.7:9004" }},
		{"TLS without client CA is not authentication", "peers.listen_addr", "not authenticated", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.TLS.CertFile, c.Peers.TLS.KeyFile = "0.0.0.0:9004", "c.pem", "k.pem"
		}},
		{"cert without key", "peers.tls.cert_file", "set together", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.TLS.CertFile = "127.0.0.1:9004", "c.pem"
		}},
		{"ca without cert", "peers.tls.ca_file", "needs peers.tls.cert_file", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.TLS.CAFile = "127.0.0.1:9004", "ca.pem"
		}},
		{"token and token file", "peers.token_file", "not both", func(c *Config) {
			c.Peers.ListenAddr, c.Peers.Token, c.Peers.TokenFile = ":9004", "s", "/run/secrets/t"
		}},
	} {
		c := Default()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.key+":") || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want %s: …%s…", tc.name, err, tc.key, tc.says)
		}
	}
	for name, mod := range map[string]func(*Peers){
		"token":      func(p *Peers) { p.Token = "s3cret" },
		"token file": func(p *Peers) { p.TokenFile = "/run/secrets/peers-token" },
		"mutual TLS": func(p *Peers) { p.TLS = PeersTLS{CertFile: "c.pem", KeyFile: "k.pem", CAFile: "ca.pem"} },
		"insecure":   func(p *Peers) { p.Insecure = true },
	} {
		c := Default()
		c.Peers.ListenAddr, c.Peers.Static = ":9004", []string{"kvroute-1.kvroute:9004"}
		mod(&c.Peers)
		if err := c.Validate(); err != nil {
			t.Errorf("valid peers config (%s) refused: %v", name, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:9004", "[::1]:9004", "localhost:9004"} {
		c := Default()
		c.Peers.ListenAddr = addr
		if err := c.Validate(); err != nil {
			t.Errorf("loopback %s without authentication refused: %v", addr, err)
		}
	}
}
