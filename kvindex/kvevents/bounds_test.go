package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
)

// The attack payload of issue 10: [1.0, <array32 declaring 0x0fffffff events>] in 15
// bytes. Decoding it used to allocate ~45 GB (one Event per declared element) and kill
// the process; it must be a plain ErrMalformed.
func TestDeclaredLengthAttack(t *testing.T) {
	p, _ := hex.DecodeString("93cb3ff0000000000000dd0fffffff")
	if len(p) != 15 {
		t.Fatal(len(p))
	}
	if _, err := Decode(p); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err %v, want ErrMalformed", err)
	}
}

// allocated returns the bytes allocated by f.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// Every declared length (array, map, str, bin, ext) is bounded by the bytes left before
// anything is allocated from it: each of these payloads declares about a million
// elements or bytes in a few bytes, and decoding them may allocate only a few KiB.
func TestDeclaredLengthsBoundedBeforeAllocating(t *testing.T) {
	batch := func(tail ...byte) []byte { return append([]byte{0x93, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, tail...) }
	event := func(key string, tail ...byte) []byte { // [1.0, [{key: <tail>}]]
		b := batch(0x91, 0x81, 0xa0|byte(len(key)))
		return append(append(b, key...), tail...)
	}
	cases := map[string][]byte{
		"events array32":       batch(0xdd, 0x00, 0x10, 0x00, 0x00),
		"events array16 + 1":   batch(0xdc, 0xff, 0xff, 0x00),
		"block_hashes array32": event("block_hashes", 0xdd, 0x00, 0x10, 0x00, 0x00, 0x01),
		"token_ids array32":    event("token_ids", 0xdd, 0x00, 0x10, 0x00, 0x00, 0x01),
		"extra_keys array32":   event("extra_keys", 0xdd, 0x00, 0x10, 0x00, 0x00, 0x01),
		"extra_keys map32":     event("extra_keys", 0x91, 0xdf, 0x00, 0x10, 0x00, 0x00, 0x01),
		"medium str32":         event("medium", 0xdb, 0x00, 0x10, 0x00, 0x00, 'G'),
		"hash bin32":           event("block_hashes", 0x91, 0xc6, 0x00, 0x10, 0x00, 0x00, 0x01),
		"ext32":                event("x", 0xc9, 0x00, 0x10, 0x00, 0x00, 0x01, 0x01),
		"batch map32":          {0xdf, 0x00, 0x10, 0x00, 0x00, 0xa2, 't', 's'},
		"event key str32":      batch(0x91, 0x81, 0xdb, 0x00, 0x10, 0x00, 0x00, 't'),
		"deep nesting":         append(event("extra_keys"), bytes.Repeat([]byte{0x91}, 100000)...),
	}
	d := NewDecoder()
	var b Batch
	for name, p := range cases {
		var err error
		n := allocated(func() { err = d.Decode(p, &b) })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
		if n > 64<<10 {
			t.Errorf("%s: decoding %d bytes allocated %d bytes", name, len(p), n)
		}
	}
}

// An event whose fields disagree is dropped alone: the decoder marks it (Err) and
// decodes the rest of the batch.
func TestInconsistentEventMarkedNotFatal(t *testing.T) {
	b := goldenStored()
	bad := b.Events[0]
	bad.TokenIDs = bad.TokenIDs[:31]
	b.Events = append([]Event{bad}, goldenRemoved().Events...)
	p, err := Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(p)
	if err != nil {
		t.Fatalf("one inconsistent event failed the whole batch: %v", err)
	}
	if len(got.Events) != 3 || !errors.Is(got.Events[0].Err, ErrMalformed) || got.Events[1].Err != nil || got.Events[2].Err != nil {
		t.Fatalf("events %+v", got.Events)
	}
	if got.Events[1].Type != TypeBlockRemoved || got.Events[2].Type != TypeAllBlocksCleared {
		t.Fatalf("valid events beside the bad one: %+v", got.Events[1:])
	}
}

// Unknown event tags are counted, not kept.
func TestUnknownEventCounted(t *testing.T) {
	// [1.0, [["FutureEvent", 1], {"type": "AllBlocksCleared"}]]
	p := []byte{0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x92, 0x92, 0xab}
	p = append(p, "FutureEvent"...)
	p = append(p, 0x01, 0x81, 0xa4)
	p = append(p, "type"...)
	p = append(p, 0xb0)
	p = append(p, "AllBlocksCleared"...)
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.Unknown != 1 || len(b.Events) != 1 || b.Events[0].Type != TypeAllBlocksCleared {
		t.Fatalf("%+v", b)
	}
}

// fuzzSeeds are the golden payloads of ../shared/reference/vllm-kv-events.md (copied
// above) and the round-trip fixture in every wire format and legacy array length.
func fuzzSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, h := range []string{goldenStoredMap, goldenStoredArray, goldenRemovedMap, "93cb3ff0000000000000dd0fffffff"} {
		p, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	win, lora, parent := int64(4096), int64(3), Int(-42)
	b := &Batch{TS: 12.5, DPRank: 2, HasDPRank: true, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []Hash{Int(-7), Bin(bytes.Repeat([]byte{0xab}, 32))}, Parent: &parent,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAID: &lora, Medium: "CPU", LoRAName: "ad",
			ExtraKeys: []any{[]any{"ad", "salt"}, nil}, GroupIdx: 1, SpecKind: "sliding_window", SlidingWindow: &win},
		{Type: TypeBlockRemoved, BlockHashes: []Hash{Uint(9)}, Medium: "GPU", GroupIdx: 1},
		{Type: TypeAllBlocksCleared},
	}}
	for _, opt := range []EncodeOptions{{}, {Format: FormatArray}, {BatchMap: true}, {Format: FormatArray, BatchMap: true},
		{Format: FormatArray, StoredLen: 6, RemovedLen: 2}, {BatchLen: 2}} {
		p, err := EncodeWith(b, opt)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// FuzzDecode: any payload either decodes into a batch whose BlockStored events are
// consistent or marked (Err), or fails with ErrMalformed; it never panics (and, with
// checkShape first, never allocates from a declared length it does not hold).
func FuzzDecode(f *testing.F) {
	for _, p := range fuzzSeeds(f) {
		f.Add(p)
	}
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, p []byte) {
		var b Batch
		if err := d.Decode(p, &b); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for i := range b.Events {
			e := &b.Events[i]
			if e.Type == TypeUnknown {
				t.Fatal("unknown event kept")
			}
			if e.Type == TypeBlockStored && e.Err == nil && len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
				t.Fatalf("inconsistent event without Err: %+v", e)
			}
		}
	})
}

// Random frames never panic and never allocate more than a small multiple of their size.
func TestRandomPayloads(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seeds := fuzzSeeds(t)
	d := NewDecoder()
	var b Batch
	for i := 0; i < 5000; i++ {
		p := append([]byte{}, seeds[rng.IntN(len(seeds))]...)
		switch i % 3 {
		case 0: // flip bytes
			for j := 0; j < 1+rng.IntN(4); j++ {
				p[rng.IntN(len(p))] = byte(rng.Uint32())
			}
		case 1: // random bytes
			p = make([]byte, 1+rng.IntN(64))
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		case 2: // truncate
			p = p[:rng.IntN(len(p))]
		}
		if err := d.Decode(p, &b); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("%x: %v", p, err)
		}
	}
}
