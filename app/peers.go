package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/kvroute/kvroute/config"

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
	auth, err := peersAuth(pc)
	if err != nil {
		return err
	}
	m, err := peers.New(peers.Options{ID: pc.ID, Router: a.Router, Index: a.Index, Interval: pc.Interval,
		SilenceTimeout: pc.SilenceTimeout, MaxMessageBytes: pc.MaxMessageBytes, MaxKeysPerWorker: pc.MaxKeysPerWorker,
		MaxPeers: pc.MaxPeers, MaxInboundBytes: pc.MaxInboundBytes, Metrics: a.Metrics.Peers, Logger: a.Logger, Auth: auth,
		Claims: peers.Claims{MaxRequests: pc.MaxRequestsPerWorker, MaxPromptTokens: a.Config.Router.MaxPromptTokens}})
	if err != nil {
		return err
	}
	a.Peers, a.PeerRegistry = m, workers.NewRegistry()
	a.PeerRegistry.Subscribe(m)
	a.PeerRegistry.Set(a.staticPeers())
	return nil
}

// peersAuth reads the peers token and TLS files (config.Peers): the token from
// peers.token or peers.token_file, this replica's certificate served and presented,
// and peers.tls.ca_file verifying peers' certificates both ways (mutual TLS).
func peersAuth(pc config.Peers) (peers.Auth, error) {
	auth := peers.Auth{Token: pc.Token}
	if pc.TokenFile != "" {
		b, err := os.ReadFile(pc.TokenFile)
		if err != nil {
			return auth, fmt.Errorf("peers.token_file: %w", err)
		}
		if auth.Token = strings.TrimSpace(string(b)); auth.Token == "" {
			return auth, fmt.Errorf("peers.token_file: %s is empty", pc.TokenFile)
		}
	}
	t := pc.TLS
	if t.CertFile == "" {
		return auth, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return auth, fmt.Errorf("peers.tls.cert_file/key_file: %w", err)
	}
	auth.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	auth.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return auth, fmt.Errorf("peers.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return auth, fmt.Errorf("peers.tls.ca_file: %s holds no PEM certificate", t.CAFile)
		}
		auth.ServerTLS.ClientCAs, auth.ServerTLS.ClientAuth = pool, tls.RequireAndVerifyClientCert
		auth.ClientTLS.RootCAs = pool
	}
	return auth, nil
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
