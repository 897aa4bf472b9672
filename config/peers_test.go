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
	} {
		c := Default()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.key+":") || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want %s: …%s…", tc.name, err, tc.key, tc.says)
		}
	}
	c := Default()
	c.Peers.ListenAddr, c.Peers.Static = ":9004", []string{"kvroute-1.kvroute:9004"}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid peers config refused: %v", err)
	}
}
