package tokenize

import (
	"fmt"
	"maps"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// proof records, for one chat template and one set of template inputs (tools,
// kwargs), which cuts of a conversation render incrementally exactly as in full
// (window.go's property), found by trying every cut of probe conversations with each
// combination of features. A cut is indexed by the generation prompt flag, the
// features of the whole conversation, the role of the message before the cut and
// the role after it (roleEnd when the cut is the conversation's end). A cell holds
// when at least one probe tried it and every try gave the full render byte for byte.
type proof struct {
	cells [2][featCombos][roleEnd][roleEnd + 1]uint8 // 0 untried, 1 held, 2 failed
}

func (p *proof) holds(agp bool, feat, before, after uint8) bool {
	if p == nil || feat&featOdd != 0 || before >= roleEnd || after > roleEnd {
		return false
	}
	return p.cells[b2i(agp)][feat][before][after] == 1
}

func (p *proof) mark(agp bool, feat, before, after uint8, ok bool) {
	c := &p.cells[b2i(agp)][feat][before][after]
	switch {
	case !ok:
		*c = 2
	case *c == 0:
		*c = 1
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// probeConversation returns a conversation with the features feat: alternating user
// and assistant turns; with featSystem a system message first; with featTools single
// and parallel tool calls and their results; with featReasoning reasoning on every
// other assistant turn, each pattern twice. Texts carry leading and trailing spaces and newlines, which
// templates often strip.
func probeConversation(feat uint8) []jsonvalue.Value {
	var msgs []map[string]any
	if feat&featSystem != 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": "Probe system prompt.\n"})
	}
	na := 0
	assistant := func(content string, calls ...string) {
		m := map[string]any{"role": "assistant", "content": content}
		if feat&featReasoning != 0 && na%2 == 0 {
			m["reasoning"] = "\nProbe reasoning " + string(rune('a'+na)) + ".\n"
		}
		na++
		if len(calls) > 0 {
			var tcs []any
			for _, id := range calls {
				tcs = append(tcs, map[string]any{"id": id, "type": "function",
					"function": map[string]any{"name": "probe_fn", "arguments": `{"x": 1}`}})
			}
			m["tool_calls"] = tcs
		}
		msgs = append(msgs, m)
	}
	user := func(s string) { msgs = append(msgs, map[string]any{"role": "user", "content": s}) }
	tool := func(id, s string) {
		msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": s})
	}
	// Twice the same pattern, so that every cut in the second copy has the features
	// before it too (templates keep state across messages, e.g. a first tool call).
	for b := range 2 {
		q := func(s string) string { return fmt.Sprintf("%s %d", s, b) }
		user(q(" Probe question one."))
		assistant(q("Probe answer one.\n"))
		user(q("Probe question two."))
		if feat&featTools != 0 {
			assistant("", q("call_1"))
			tool(q("call_1"), q("Probe result one."))
			assistant(q("Probe answer two."), q("call_2"), q("call_3"))
			tool(q("call_2"), q("Probe result two."))
			tool(q("call_3"), q("Probe result three."))
		}
		assistant(q("\nProbe answer three."))
	}
	user("Probe question four.")
	return jsonvalue.MessagesOf(msgs)
}

// prove tries every cut of the probe conversations under vars (a chatCall's vars; not
// modified).
func (m *Model) prove(vars map[string]jinja.Value) *proof {
	vars = maps.Clone(vars)
	p := &proof{}
	for feat := range uint8(featCombos) {
		msgs := probeConversation(feat)
		conv, err := normalizeMessages(msgs, m.chat.openai)
		if err != nil {
			continue
		}
		items := conv.AsList().Items
		at := func(i int) (jinja.Value, error) { return items[i], nil }
		n := len(items)
		roles := make([]uint8, n)
		for i, msg := range msgs {
			roles[i] = roleOf(msg)
		}
		sysOff := 0
		if roles[0] == roleSystem {
			sysOff = 1
		}
		// prefix[k] = render(C[:k]) and head[k] = its head window's render, no flags.
		prefix, heads := make([]string, n+1), make([]string, n+1)
		okPrefix := make([]bool, n+1)
		for k := 1; k <= n; k++ {
			r, err := m.renderList(vars, jinja.NewList(append([]jinja.Value(nil), items[:k]...)), false, false, nil)
			h, hok := m.headAt(vars, at, roles, sysOff, k)
			prefix[k], heads[k], okPrefix[k] = r, h, err == nil && hok
		}
		for j := 1; j <= n; j++ { // the conversation C[:j]
			for _, agp := range []bool{false, true} {
				full, ferr := m.renderList(vars, jinja.NewList(append([]jinja.Value(nil), items[:j]...)), agp, false, nil)
				for k := j; k >= 1 && k >= j-maxSuffix; k-- {
					after := roleEnd
					if k < j {
						after = roles[k]
					}
					if !okPrefix[k] {
						continue // never cached: no entry for this prefix can exist
					}
					s, ok := m.suffixAt(vars, at, roles, sysOff, k, j, heads[k], agp)
					switch {
					case ferr != nil && !ok:
						// Both refuse: the request is rendered in full and fails there.
					case ferr != nil || !ok:
						p.mark(agp, feat, roles[k-1], after, false)
					default:
						p.mark(agp, feat, roles[k-1], after, prefix[k]+s == full)
					}
				}
			}
		}
	}
	return p
}

// proofFor returns the proof for the template inputs of ctx, or nil while there is
// none: the second request with new inputs starts it in the background (one at a
// time); requests are rendered in full until it is done. The map is bounded:
// past maxProofs proofs it starts over.
func (c *renderCache) proofFor(m *Model, ctx uint64, vars map[string]jinja.Value) *proof {
	c.proofMu.Lock()
	defer c.proofMu.Unlock()
	if p, ok := c.proofs[ctx]; ok {
		return p
	}
	// Only inputs that come back are worth a proof (a conversation's next turn repeats
	// its tools): a client sending new tools every time never starts one.
	if _, again := c.seen[ctx]; !again {
		if len(c.seen) >= maxSeen {
			clear(c.seen)
		}
		c.seen[ctx] = struct{}{}
		return nil
	}
	if !c.proving.CompareAndSwap(0, 1) {
		return nil
	}
	vars = maps.Clone(vars)
	c.proofWG.Add(1)
	go func() {
		defer c.proofWG.Done()
		p := m.prove(vars)
		c.proofMu.Lock()
		if len(c.proofs) >= maxProofs {
			clear(c.proofs)
		}
		c.proofs[ctx] = p
		c.proofMu.Unlock()
		c.proving.Store(0)
	}()
	return nil
}

// maxProofs bounds the proofs a model keeps (one per distinct tools and kwargs set);
// maxSeen the inputs seen once.
const (
	maxProofs = 256
	maxSeen   = 4096
)
