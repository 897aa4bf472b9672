package admission

import (
	"container/list"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/config"
)

// outputHistory learns each tenant × model's output length: a ring of the last
// Samples settled output token counts per key, at most MaxKeys keys (least recently
// used forgotten first). Memory: MaxKeys × Samples × 4 bytes plus the keys. Each
// replica learns from its own settlements (not shared through Redis).
type outputHistory struct {
	cfg config.OutputHistory
	mu  sync.Mutex
	idx map[histKey]*list.Element // of *ring
	lru *list.List                // front: most recently used
}

type histKey struct{ tenant, model string }

type ring struct {
	key  histKey
	buf  []int32
	n, i int // samples held, next slot
}

func newOutputHistory(cfg config.OutputHistory) *outputHistory {
	return &outputHistory{cfg: cfg, idx: map[histKey]*list.Element{}, lru: list.New()}
}

// add records one settled output length for tenant × model.
func (h *outputHistory) add(tenant, model string, output int) {
	k := histKey{tenant, model}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.idx[k]
	if e == nil {
		if h.lru.Len() >= h.cfg.MaxKeys {
			old := h.lru.Back()
			h.lru.Remove(old)
			delete(h.idx, old.Value.(*ring).key)
		}
		e = h.lru.PushFront(&ring{key: k, buf: make([]int32, h.cfg.Samples)})
		h.idx[k] = e
	} else {
		h.lru.MoveToFront(e)
	}
	r := e.Value.(*ring)
	r.buf[r.i] = int32(min(max(output, 0), 1<<31-1))
	r.i = (r.i + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// p90 is the nearest-rank 90th percentile (the ⌈0.9·n⌉-th smallest) of the held
// samples of tenant × model; false until MinSamples are held.
func (h *outputHistory) p90(tenant, model string) (int, bool) {
	var tmp [1024]int32
	h.mu.Lock()
	e := h.idx[histKey{tenant, model}]
	if e == nil || e.Value.(*ring).n < h.cfg.MinSamples {
		h.mu.Unlock()
		return 0, false
	}
	r := e.Value.(*ring)
	s := tmp[:r.n]
	copy(s, r.buf[:r.n])
	h.mu.Unlock()
	slices.Sort(s)
	return int(s[(9*len(s)+9)/10-1]), true
}

// len is the number of keys held.
func (h *outputHistory) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lru.Len()
}
