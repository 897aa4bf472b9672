package app

import (
	"net/http"

	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/workers"
)

// newPeers builds the exchange with peer replicas when peers.listen_addr is set: the
// Manager, and a registry of peer addresses that the static list (and the discovery
// source, started by Run) fills and the Manager follows.
func (a *App) newPeers() error {
	pc := a.Config.Peers
	if !pc.Enabled() {
		return nil
	}
	m, err := peers.New(peers.Options{ID: pc.ID, Router: a.Router, Index: a.Index, Interval: pc.Interval,
		SilenceTimeout: pc.SilenceTimeout, MaxMessageBytes: pc.MaxMessageBytes, MaxKeysPerWorker: pc.MaxKeysPerWorker,
		MaxPeers: pc.MaxPeers, Metrics: a.Metrics.Peers, Logger: a.Logger})
	if err != nil {
		return err
	}
	a.Peers, a.PeerRegistry = m, workers.NewRegistry()
	a.PeerRegistry.Subscribe(m)
	a.PeerRegistry.Set(a.staticPeers())
	return nil
}

func (a *App) staticPeers() []*workers.Worker {
	var out []*workers.Worker
	for _, addr := range a.Config.Peers.Static {
		out = append(out, &workers.Worker{Name: addr, Address: addr})
	}
	return out
}

// newPeerDiscovery returns the source of discovered peers (nil: none), the workers
// discovery sources writing into the peer registry: a discovered "worker" is a replica
// at its peers port.
func (a *App) newPeerDiscovery() (workers.Source, error) {
	pc := a.Config.Peers
	if a.Peers == nil {
		return nil, nil
	}
	switch pc.Discovery {
	case "dns":
		return &workers.DNS{Registry: a.PeerRegistry, Name: pc.DNS.Name, HTTPPort: pc.DNS.Port, Interval: pc.RefreshInterval,
			Static: a.staticPeers(), Logger: a.Logger}, nil
	case "kubernetes":
		client, ns, err := workers.InClusterClient()
		if err != nil {
			return nil, err
		}
		if pc.Kubernetes.Namespace != "" {
			ns = pc.Kubernetes.Namespace
		}
		return &workers.Kubernetes{Registry: a.PeerRegistry, Client: client, Namespace: ns, Service: pc.Kubernetes.Service,
			LabelSelector: pc.Kubernetes.LabelSelector, HTTPPortName: pc.Kubernetes.PortName, Resync: pc.RefreshInterval,
			Static: a.staticPeers(), Logger: a.Logger}, nil
	}
	return nil, nil
}

// debugPeers serves /debug/peers: this replica's id and summary, the addresses it
// streams to, and every peer whose state it holds (age, bytes, bookings imported). It
// takes the exchange's own lock only, never one the request path needs.
func (a *App) debugPeers(w http.ResponseWriter, _ *http.Request) {
	if a.Peers == nil {
		writeJSON(w, http.StatusOK, map[string]any{"enabled": false})
		return
	}
	v := a.Peers.Snapshot()
	writeJSON(w, http.StatusOK, map[string]any{"enabled": true, "peers": v, "imported_by_worker": a.Router.PeerBookings()})
}
