package config

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/peers"
)

// Peers configures the exchange of bookings between kvroute replicas (package peers).
// It is on when listen_addr is set.
type Peers struct {
	// ListenAddr is where this replica serves its peers' streams, "host:port"; "" = no
	// peers (one replica, or replicas blind to each other).
	ListenAddr string `mapstructure:"listen_addr"`
	// ID names this replica among its peers; "" = the hostname (pod name) and a random
	// suffix.
	ID string `mapstructure:"id"`
	// Static lists the peers' listen addresses, "host:port". A replica may list itself
	// (it notices and skips itself), so every replica can share one list.
	Static []string `mapstructure:"static"`
	// Discovery finds peers besides Static: "" (none), "dns" or "kubernetes", through
	// the same sources as discovery.mode for workers.
	Discovery       string        `mapstructure:"discovery"`
	RefreshInterval time.Duration `mapstructure:"refresh_interval"`
	DNS             PeersDNS      `mapstructure:"dns"`
	Kubernetes      PeersK8s      `mapstructure:"kubernetes"`
	// Interval coalesces local changes: at most one summary per Interval to each peer.
	Interval time.Duration `mapstructure:"interval"`
	// SilenceTimeout drops a peer's bookings and imported prefixes when nothing came
	// from it for this long (a peer that exits or is killed is dropped when its stream
	// ends, at once). Summaries are re-sent every SilenceTimeout/3 while idle.
	SilenceTimeout time.Duration `mapstructure:"silence_timeout"`
	// MaxMessageBytes bounds one summary, received (refused before reading) and sent
	// (block keys are cut to fit).
	MaxMessageBytes int `mapstructure:"max_message_bytes"`
	// MaxKeysPerWorker bounds the block keys per worker in one summary.
	MaxKeysPerWorker int `mapstructure:"max_keys_per_worker"`
	// MaxPeers bounds the peer states held (and inbound streams: twice as many).
	MaxPeers int `mapstructure:"max_peers"`
}

// PeersDNS resolves a name whose addresses are the replicas (a headless Service).
type PeersDNS struct {
	Name string `mapstructure:"name"`
	Port int    `mapstructure:"port"` // peers port on every address
}

// PeersK8s selects the EndpointSlices of the replicas' Service.
type PeersK8s struct {
	Namespace     string `mapstructure:"namespace"` // "" = kvroute's own
	Service       string `mapstructure:"service"`
	LabelSelector string `mapstructure:"label_selector"`
	PortName      string `mapstructure:"port_name"` // the EndpointSlice port of peers.listen_addr
}

func defaultPeers() Peers {
	return Peers{RefreshInterval: 10 * time.Second, DNS: PeersDNS{Port: 9004}, Kubernetes: PeersK8s{PortName: "peers"},
		Interval: peers.DefaultInterval, SilenceTimeout: peers.DefaultSilenceTimeout, MaxMessageBytes: peers.DefaultMaxMessageBytes,
		MaxKeysPerWorker: peers.DefaultMaxKeysPerWorker, MaxPeers: peers.DefaultMaxPeers}
}

// Enabled reports whether this replica exchanges bookings with peers.
func (p Peers) Enabled() bool { return p.ListenAddr != "" }

func (p Peers) validate(ix Index) error {
	configured := len(p.Static) > 0 || p.Discovery != ""
	if !p.Enabled() {
		if configured {
			return fieldErr("peers.listen_addr", "is required when peers.static or peers.discovery is set (peers stream to each other's listen address)")
		}
		return nil
	}
	if err := validateHostPort("peers.listen_addr", p.ListenAddr, true); err != nil {
		return err
	}
	if ix.BindEndpoint != "" {
		return fieldErr("index.bind_endpoint", "cannot be used with peers (peers.listen_addr is set): a vLLM publisher connects to one endpoint, so only one replica would get its KV events; use connect mode (workers[].kv_events.endpoint / discovery.kv_events_endpoint), where every replica subscribes to every publisher")
	}
	for i, s := range p.Static {
		if err := validateHostPort(fmt.Sprintf("peers.static[%d]", i), s, true); err != nil {
			return err
		}
	}
	switch p.Discovery {
	case "":
	case "dns":
		if p.DNS.Name == "" {
			return fieldErr("peers.dns.name", "peers.discovery=dns requires peers.dns.name")
		}
		if p.DNS.Port <= 0 || p.DNS.Port > 65535 {
			return fieldErr("peers.dns.port", "must be in 1..65535, got %d", p.DNS.Port)
		}
	case "kubernetes":
		if p.Kubernetes.Service == "" && p.Kubernetes.LabelSelector == "" {
			return fieldErr("peers.kubernetes.service", "peers.discovery=kubernetes requires peers.kubernetes.service or peers.kubernetes.label_selector")
		}
	default:
		return fieldErr("peers.discovery", "unknown discovery %q (one of \"\", dns, kubernetes)", p.Discovery)
	}
	switch {
	case p.Discovery != "" && p.RefreshInterval < time.Second:
		return fieldErr("peers.refresh_interval", "must be ≥ 1s, got %s", p.RefreshInterval)
	case p.Interval < time.Millisecond || p.Interval > time.Second:
		return fieldErr("peers.interval", "must be in 1ms..1s, got %s", p.Interval)
	case p.SilenceTimeout < 4*p.Interval:
		return fieldErr("peers.silence_timeout", "must be ≥ 4 × peers.interval (%s), got %s", 4*p.Interval, p.SilenceTimeout)
	case p.MaxMessageBytes < 4096 || p.MaxMessageBytes > 64<<20:
		return fieldErr("peers.max_message_bytes", "must be in 4096..67108864 bytes, got %d", p.MaxMessageBytes)
	case p.MaxKeysPerWorker < 0:
		return fieldErr("peers.max_keys_per_worker", "must be ≥ 0, got %d", p.MaxKeysPerWorker)
	case p.MaxPeers < 1 || p.MaxPeers > 1024:
		return fieldErr("peers.max_peers", "must be in 1..1024, got %d", p.MaxPeers)
	case len(p.ID) > 200:
		return fieldErr("peers.id", "must be at most 200 bytes, got %d", len(p.ID))
	}
	return nil
}
