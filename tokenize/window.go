package tokenize

import (
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// Incremental rendering rests on one property of chat templates, checked per
// template and per set of template inputs (proof.go), never assumed: for a
// conversation C of n messages and a cut k ≤ n,
//
//	render(C, flags) = render(C[:k], no flags) + suffix(C, k, flags)
//
// where suffix is computed from a short window instead of the whole conversation:
// the window is C's leading system message (if any), a head C[s:k] of one to four
// messages before the cut (starting at a user message where one is near, at the same
// parity as in C so that role-alternation checks see the same indices), then C[k:n];
// suffix(C, k, flags) = render(window, flags) with render(head window, no flags)
// removed from its front. The cached render of C[:k] and of its head window come from
// the previous turn, so the next turn renders a few messages, not the conversation.

// Message roles as the proof tables index them.
const (
	roleSystem uint8 = iota
	roleUser
	roleAssistant
	roleTool
	roleEnd // after the cut: nothing (the cut is the conversation's end)
	roleOther
)

func roleOf(msg jsonvalue.Value) uint8 {
	r, _ := msg.Field("role").Str()
	switch r {
	case "system":
		return roleSystem
	case "user":
		return roleUser
	case "assistant":
		return roleAssistant
	case "tool":
		return roleTool
	}
	return roleOther
}

// Message features: a request is rendered incrementally only when its messages' features
// together were proven on probe conversations with the same features.
const (
	featSystem    uint8 = 1 << iota // a system message first
	featTools                       // assistant tool calls or tool results
	featReasoning                   // assistant reasoning
	featOdd                         // anything the probes do not cover: always rendered in full
	featCombos    = 8               // combinations of the three proven features
)

// maxSuffix is the most messages after a cached prefix rendered incrementally.
const maxSuffix = 4

// messageFeatures returns the features of msgs[i]. lits are the strings the
// template tests message text against: a message containing one is odd, since the
// template may then render it (or its neighbours) unlike the probes.
func messageFeatures(i int, msg jsonvalue.Value, lits []string) uint8 {
	var f uint8
	role := roleOf(msg)
	switch {
	case role == roleSystem && i == 0:
		f |= featSystem
	case role == roleSystem, role == roleOther:
		return featOdd
	case role == roleTool:
		f |= featTools
	}
	for _, mb := range msg.Members() {
		v := mb.Value
		switch mb.Key {
		case "role":
		case "content":
			if !textClean(v, lits) {
				return featOdd
			}
		case "tool_calls":
			if v.Kind() == jsonvalue.Array && v.Len() > 0 {
				if role != roleAssistant {
					return featOdd
				}
				f |= featTools
			}
		case "reasoning", "reasoning_content":
			if v.IsNull() {
				continue
			}
			if role != roleAssistant || !textClean(v, lits) {
				return featOdd
			}
			f |= featReasoning
		case "tool_call_id":
			if role != roleTool {
				return featOdd
			}
		default:
			return featOdd
		}
	}
	return f
}

// textClean reports whether content (a string, null, or text parts) contains none of
// lits.
func textClean(v jsonvalue.Value, lits []string) bool {
	switch v.Kind() {
	case jsonvalue.Null:
		return true
	case jsonvalue.String:
		for _, l := range lits {
			if strings.Contains(v.Text(), l) {
				return false
			}
		}
		return true
	case jsonvalue.Array:
		for i := range v.Len() {
			p := v.Index(i)
			if p.Kind() == jsonvalue.String {
				if !textClean(p, lits) {
					return false
				}
				continue
			}
			if p.Kind() != jsonvalue.Object {
				return false
			}
			for _, mb := range p.Members() {
				if mb.Key != "type" && !textClean(mb.Value, lits) {
					return false
				}
			}
		}
		return true
	}
	return false
}

// literalTests finds the string literals a template tests text with: `'x' in y`,
// `y.startswith('x')`, endswith, split, replace, find, … (Jinja string methods as
// transformers exposes Python's).
var literalTests = regexp.MustCompile(`(?:(['"])((?:[^'"\\]|\\.)*)['"]\s+(?:not\s+)?in\b)|(?:\.(?:startswith|endswith|split|rsplit|replace|find|rfind|index|count|partition|rpartition)\(\s*(['"])((?:[^'"\\]|\\.)*)['"])`)

// templateLiterals returns the literals of literalTests in src, unescaped, without
// empty and whitespace-only ones (stripping whitespace acts on one message only).
func templateLiterals(src string) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range literalTests.FindAllStringSubmatch(src, -1) {
		l := g[2]
		if g[4] != "" {
			l = g[4]
		}
		l = strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\'`, "'", `\"`, `"`, `\\`, `\`).Replace(l)
		if strings.TrimSpace(l) == "" || seen[l] {
			continue
		}
		seen[l] = true
		out = append(out, l)
	}
	return out
}

// headStart returns where the head of the window for a cut at k starts: the last user
// message among the four before the cut at even distance from the first non-system
// message, else the message before the cut (or the one before it, for parity).
// sysOff is 1 when msgs[0] is a system message. k == sysOff gives k (no head).
func headStart(roles []uint8, k, sysOff int) int {
	if k <= sysOff {
		return k
	}
	for j := k - 1; j >= sysOff && j >= k-maxSuffix; j-- {
		if (j-sysOff)%2 == 0 && roles[j] == roleUser {
			return j
		}
	}
	j := k - 1
	if (j-sysOff)%2 != 0 {
		j--
	}
	return j
}

// window returns the message list conv[:sysOff] ++ conv[s:end]; conv(i) gives the
// normalized message i.
func window(conv func(int) (jinja.Value, error), sysOff, s, end int) (jinja.Value, error) {
	items := make([]jinja.Value, 0, sysOff+end-s)
	for i := range sysOff {
		v, err := conv(i)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
	}
	for i := s; i < end; i++ {
		v, err := conv(i)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
	}
	return jinja.NewList(items), nil
}

// suffixAt renders the window of a cut at k over messages [:n] with the flags and
// returns what follows head (the head window's render without flags); false when the
// window does not render or does not start with head.
func (m *Model) suffixAt(vars map[string]jinja.Value, conv func(int) (jinja.Value, error), roles []uint8, sysOff, k, n int, head string, agp bool) (string, bool) {
	w, err := window(conv, sysOff, headStart(roles, k, sysOff), n)
	if err != nil {
		return "", false
	}
	out, err := m.renderList(vars, w, agp, false, nil)
	if err != nil || !strings.HasPrefix(out, head) {
		return "", false
	}
	return out[len(head):], true
}

// headAt renders the head window of a cut at k without flags.
func (m *Model) headAt(vars map[string]jinja.Value, conv func(int) (jinja.Value, error), roles []uint8, sysOff, k int) (string, bool) {
	w, err := window(conv, sysOff, headStart(roles, k, sysOff), k)
	if err != nil {
		return "", false
	}
	out, err := m.renderList(vars, w, false, false, nil)
	return out, err == nil
}
