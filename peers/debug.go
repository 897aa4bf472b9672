package peers

import (
	"context"
	"os"
	"sort"
	"strconv"
	"time"

	"math/rand/v2"

	"google.golang.org/grpc/peer"

	"github.com/kvroute/kvroute/scoring"
)

// DefaultID is the hostname (a pod's name in Kubernetes) and a random suffix.
func DefaultID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "kvroute"
	}
	if len(h) > 200 {
		h = h[:200]
	}
	return h + "-" + strconv.FormatUint(rand.Uint64()%1e8, 36)
}

func peerAddr(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", false
	}
	return p.Addr.String(), true
}

// View is the /debug/peers document.
type View struct {
	ID            string       `json:"id"`
	Seq           uint64       `json:"seq"`            // of the latest summary built
	SummaryBytes  int          `json:"summary_bytes"`  // its size
	SummaryKeys   int          `json:"summary_keys"`   // block keys in it
	BytesSent     uint64       `json:"bytes_sent"`     // to all targets since start
	BytesReceived uint64       `json:"bytes_received"` // from all peers since start
	Targets       []TargetView `json:"targets"`
	Peers         []PeerView   `json:"peers"`
}

// TargetView is one address this replica streams to.
type TargetView struct {
	Address   string `json:"address"`
	Connected bool   `json:"connected"`
	Self      bool   `json:"self"` // the address is this replica
	Messages  uint64 `json:"messages"`
	LastError string `json:"last_error,omitempty"`
}

// PeerView is one peer whose state this replica holds.
type PeerView struct {
	ID       string           `json:"id"`
	Remote   string           `json:"remote"`
	Seq      uint64           `json:"seq"`
	Age      time.Duration    `json:"age_ns"` // since its last summary
	Messages uint64           `json:"messages"`
	Bytes    uint64           `json:"bytes"`
	Booked   scoring.Booked   `json:"booked"` // imported, all workers
	Workers  []PeerWorkerView `json:"workers"`
}

// PeerWorkerView is what a peer reported for one worker.
type PeerWorkerView struct {
	Worker        string         `json:"worker"`
	Booked        scoring.Booked `json:"booked"`
	OldestPrefill time.Time      `json:"oldest_prefill,omitzero"`
	Keys          int            `json:"keys"`
}

// Snapshot returns the exchange's state. It holds the Manager's own lock, never one
// the request path needs.
func (m *Manager) Snapshot() View {
	cur := m.cur.Load()
	v := View{ID: m.o.ID, Seq: cur.seq, SummaryBytes: len(cur.b), SummaryKeys: cur.keys,
		BytesSent: m.sent.Load(), BytesReceived: m.recv.Load()}
	now := m.o.Now()
	m.mu.Lock()
	for _, t := range m.targets {
		tv := TargetView{Address: t.addr, Connected: t.connected.Load(), Self: t.self.Load(), Messages: t.msgs.Load()}
		if e := t.lastErr.Load(); e != nil {
			tv.LastError = *e
		}
		v.Targets = append(v.Targets, tv)
	}
	for _, p := range m.peers {
		pv := PeerView{ID: p.id, Remote: p.remote, Seq: p.seq, Age: now.Sub(p.last), Messages: p.msgs, Bytes: p.bytes, Booked: p.total}
		for name, im := range p.workers {
			pv.Workers = append(pv.Workers, PeerWorkerView{Worker: name, Booked: im.booked, OldestPrefill: im.oldest, Keys: im.Keys()})
		}
		sort.Slice(pv.Workers, func(i, j int) bool { return pv.Workers[i].Worker < pv.Workers[j].Worker })
		v.Peers = append(v.Peers, pv)
	}
	m.mu.Unlock()
	sort.Slice(v.Targets, func(i, j int) bool { return v.Targets[i].Address < v.Targets[j].Address })
	sort.Slice(v.Peers, func(i, j int) bool { return v.Peers[i].ID < v.Peers[j].ID })
	return v
}
