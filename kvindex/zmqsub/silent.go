package zmqsub

import (
	"strings"

	"github.com/kvroute/kvroute/kvindex"
)

// checkSilent warns once per worker that has taken traffic for Options.SilentAfter
// without one KV event batch (kvindex.Index.Silent): it is routed on speculative
// entries, or on load alone once they expire, and nothing else says so. The line names
// what to check: in connect mode the endpoint kvroute dials (a publisher that also
// dials, i.e. configured without "*", never meets it), in bind mode the bound endpoint
// and the topic the worker's messages must carry.
func (m *Manager) checkSilent() {
	if m.opt.SilentAfter <= 0 {
		return
	}
	type cand struct{ name, endpoint, topic string }
	var cs []cand
	m.mu.Lock()
	for name, s := range m.subs {
		if !m.silentWarned[name] {
			topic := strings.Replace(m.opt.TopicPattern, "{addr}", s.w.Address, 1)
			cs = append(cs, cand{name, s.w.KVEvents.Endpoint, topic})
		}
	}
	m.mu.Unlock()
	for _, c := range cs {
		d, ok := m.ix.Silent(c.name)
		if !ok || d < m.opt.SilentAfter {
			continue
		}
		m.mu.Lock()
		if _, live := m.subs[c.name]; !live || m.silentWarned[c.name] {
			m.mu.Unlock()
			continue
		}
		m.silentWarned[c.name] = true
		m.mu.Unlock()
		args := []any{"worker", c.name, "silent_for", d.Round(1e9).String(), "index_mode", m.ix.Mode(c.name).String()}
		if m.BindMode() {
			args = append(args, "mode", "bind", "endpoint", m.opt.BindEndpoint, "expected_topic", c.topic,
				"hint", "the worker's publisher must connect to this endpoint (its endpoint without \"*\") with that topic")
		} else {
			args = append(args, "mode", "connect", "endpoint", c.endpoint,
				"hint", "the worker's publisher must bind this endpoint (\"tcp://*:PORT\"); a publisher that also dials never meets kvroute")
		}
		args = append(args, "docs", kvindex.DocsNoEvents)
		m.log.Warn("kvindex: worker has taken traffic without one KV event; it is routed on speculative entries, and on load alone once they expire", args...)
	}
}
