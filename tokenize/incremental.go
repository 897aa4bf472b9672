package tokenize

import (
	"maps"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/request"
)

// selfCheckEvery: one fast-path render in this many is compared, off the request
// path, with a full render and full encode of the same request.
const selfCheckEvery = 64

// chatIDs renders and encodes a chat request (RenderChat then EncodeText(text, add)),
// incrementally when the render cache holds a prefix of the conversation and the
// template was proven exact for the cut (window.go, proof.go); in full otherwise, then
// storing the conversation for the next turn.
func (m *Model) chatIDs(req *request.Request, add bool) ([]uint32, error) {
	c, err := m.prepareChat(req)
	if err != nil {
		return nil, err
	}
	rc := m.render
	if rc == nil || rc.off.Load() || c.cfm || c.flagKwargs != nil || len(c.msgs) == 0 || m.chat.clock == clockTime {
		return m.fullChatIDs(c, add)
	}
	n := len(c.msgs)
	t := &turn{m: m, c: c, conv: make([]jinja.Value, n), roles: make([]uint8, n)}
	for i, msg := range c.msgs {
		t.roles[i] = roleOf(msg)
	}
	if t.roles[0] == roleSystem {
		t.sysOff = 1
	}
	ctx := contextHash(req)
	if m.chat.clock == clockDate {
		// The template writes today's date (strftime_now, local time as the engine's
		// renderer does): yesterday's prefixes are not today's.
		ctx ^= xxhash.Sum64String(time.Now().Format(time.DateOnly))
	}
	hs := prefixHashes(ctx, c.msgs, make([]uint64, 0, n))
	p := rc.proofFor(m, ctx, c.vars)
	if p == nil {
		rc.misses.Add(1)
		return m.fullChatIDs(c, add)
	}
	for k := n; k >= 1 && k >= n-maxSuffix; k-- {
		e := rc.get(renderKey{ctx, hs[k-1], k})
		if e == nil {
			continue
		}
		feat := e.feat
		for i := k; i < n; i++ {
			feat |= messageFeatures(i, c.msgs[i], m.chat.lits)
		}
		if ids, ok := t.fromPrefix(e, p, feat, k, hs[n-1], ctx, add); ok {
			rc.hits.Add(1)
			return ids, nil
		}
		break
	}
	rc.misses.Add(1)
	conv, err := t.all()
	if err != nil {
		return nil, err
	}
	text, err := m.renderFull(c, conv)
	if err != nil {
		return nil, err
	}
	var feat uint8
	for i, msg := range c.msgs {
		feat |= messageFeatures(i, msg, m.chat.lits)
	}
	// The conversation rendered without the generation prompt is what the next turn
	// extends: text minus the prompt, the prompt found by rendering the last head window
	// with and without it (exact by the proof of the cut at the end).
	gen := ""
	ok := p.holds(c.agp, feat, t.roles[n-1], roleEnd) && p.holds(false, feat, t.roles[n-1], roleEnd)
	var head string
	if ok {
		head, ok = m.headAt(c.vars, t.at, t.roles, t.sysOff, n)
	}
	if ok && c.agp {
		gen, ok = m.suffixAt(c.vars, t.at, t.roles, t.sysOff, n, n, head, true)
		ok = ok && len(gen) <= len(text) && text[len(text)-len(gen):] == gen
	}
	dst := make([]uint32, 0, len(text)/4+8)
	if add {
		dst = append(dst, m.post.before...)
	}
	base := len(dst)
	prefix := text[:len(text)-len(gen)]
	dst, cut, at := m.appendBody(dst, text, true, len(prefix)-m.raw.maxLen)
	if ok {
		rc.put(&renderEntry{key: renderKey{ctx, hs[n-1], n}, text: prefix, textLen: len(prefix), cut: cut,
			ids: slices.Clone(dst[base:at]), idsLen: at - base, head: head, feat: feat})
	}
	if add {
		dst = append(dst, m.post.after...)
	}
	return dst, nil
}

// fullChatIDs renders and encodes without the render cache.
func (m *Model) fullChatIDs(c *chatCall, add bool) ([]uint32, error) {
	conv, err := normalizeMessages(c.msgs, m.chat.openai)
	if err != nil {
		return nil, err
	}
	text, err := m.renderFull(c, conv)
	if err != nil {
		return nil, err
	}
	return m.EncodeText(text, add), nil
}

// turn is one chat request on its way through the render cache: its messages are
// normalized only where a window needs them.
type turn struct {
	m      *Model
	c      *chatCall
	conv   []jinja.Value // normalized messages, filled on demand
	roles  []uint8
	sysOff int
}

func (t *turn) at(i int) (jinja.Value, error) {
	if t.conv[i].IsUndefined() {
		v, err := normalizeMessage(t.c.msgs[i], t.m.chat.openai)
		if err != nil {
			return jinja.Undefined(), err
		}
		t.conv[i] = v
	}
	return t.conv[i], nil
}

func (t *turn) all() (jinja.Value, error) {
	for i := range t.conv {
		if _, err := t.at(i); err != nil {
			return jinja.Undefined(), err
		}
	}
	return jinja.NewList(t.conv), nil
}

// fromPrefix renders and encodes the turn from the cached prefix e of k messages:
// only the window after the cut is rendered and only the text after e's cut is
// encoded. It stores the whole conversation (n messages, hash hn) for the next turn.
// false: the cut is not proven or a window check failed; the caller renders in full.
func (t *turn) fromPrefix(e *renderEntry, p *proof, feat uint8, k int, hn, ctx uint64, add bool) ([]uint32, bool) {
	m, c, n := t.m, t.c, len(t.c.msgs)
	after := roleEnd
	if k < n {
		after = t.roles[k]
	}
	if !p.holds(c.agp, feat, t.roles[k-1], after) {
		return nil, false
	}
	suffix, ok := m.suffixAt(c.vars, t.at, t.roles, t.sysOff, k, n, e.head, c.agp)
	if !ok {
		return nil, false
	}
	// The stored conversation is rendered without the generation prompt: the same
	// window without flags, proven for this cut too; the next turn's head window.
	var plain, head string
	store := k < n && p.holds(false, feat, t.roles[k-1], after)
	if store {
		if !c.agp {
			plain = suffix
		} else {
			plain, store = m.suffixAt(c.vars, t.at, t.roles, t.sysOff, k, n, e.head, false)
			store = store && len(plain) <= len(suffix) && suffix[:len(plain)] == plain
		}
	}
	if store {
		if sn := headStart(t.roles, n, t.sysOff); sn == headStart(t.roles, k, t.sysOff) {
			head = e.head + plain // the head window of n is this window
		} else {
			head, store = m.headAt(c.vars, t.at, t.roles, t.sysOff, n)
		}
	}
	tail := e.textFrom(e.cut) + suffix
	dst := make([]uint32, 0, len(m.post.before)+e.idsLen+len(tail)/3+len(m.post.after)+8)
	if add {
		dst = append(dst, m.post.before...)
	}
	dst = e.appendIDs(dst)
	mark := len(dst)
	limit := e.textLen + len(plain) - m.raw.maxLen - e.cut
	dst, cut, at := m.appendBody(dst, tail, e.cut == 0, limit)
	if store {
		ne := &renderEntry{key: renderKey{ctx, hn, n}, parent: e, depth: e.depth + 1, text: plain, textLen: e.textLen + len(plain),
			cut: e.cut, idsLen: e.idsLen, head: head, feat: feat}
		if cut > 0 {
			ne.cut, ne.ids, ne.idsLen = e.cut+cut, slices.Clone(dst[mark:at]), e.idsLen+at-mark
		}
		if ne.depth > maxDepth { // flatten
			base := mark - e.idsLen
			ne.parent, ne.depth, ne.text, ne.ids = nil, 0, e.textFrom(0)+plain, slices.Clone(dst[base:base+ne.idsLen])
		}
		m.render.put(ne)
	}
	if add {
		dst = append(dst, m.post.after...)
	}
	if m.render.served.Add(1)%selfCheckEvery == 1 {
		m.selfCheck(c, e, tail, dst, add)
	}
	return dst, true
}

// selfCheck compares, in the background, a fast-path result (text rendered, ids
// returned) with the full render and encode of the same request; a difference is
// counted and turns the model's render cache off. At most one runs at a time.
func (m *Model) selfCheck(c *chatCall, e *renderEntry, tail string, ids []uint32, add bool) {
	rc := m.render
	if !rc.checking.CompareAndSwap(0, 1) {
		return
	}
	text := e.textFrom(0)[:e.cut] + tail
	cc := &chatCall{msgs: c.msgs, vars: maps.Clone(c.vars), agp: c.agp}
	ids = append([]uint32(nil), ids...)
	rc.proofWG.Add(1)
	go func() {
		defer rc.proofWG.Done()
		defer rc.checking.Store(0)
		rc.checks.Add(1)
		conv, err := normalizeMessages(cc.msgs, m.chat.openai)
		var full string
		if err == nil {
			full, err = m.renderFull(cc, conv)
		}
		if err != nil || full != text || !slices.Equal(m.EncodeText(full, add), ids) {
			rc.disagreements.Add(1)
			rc.off.Store(true)
		}
	}()
}
