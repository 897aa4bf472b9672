package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

// Golden payloads from ../shared/reference/vllm-kv-events.md, captured from vLLM 0.26
// (map format) and an older vLLM (positional arrays). Copied here so that the test does
// not need ../shared.
const (
	goldenStoredMap   = "93cb41daa8dbe0359fe7918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfc1eea2c389c3760dcf60b6a6999a5b74f1b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0020ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013bcd15f01ece0002505dccc6ce0002505cce00012d23ccc6ce00025073cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
	goldenStoredArray = "93cb41daa8dbe0359fe7919bab426c6f636b53746f72656492cfc1eea2c389c3760dcf60b6a6999a5b74f1c0dc0020ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013bcd15f01ece0002505dccc6ce0002505cce00012d23ccc6ce00025073cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f710c0a3475055c092c0c000ae66756c6c5f617474656e74696f6e00"
	goldenRemovedMap  = "93cb41daa8dbe0359fe79284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf60b6a6999a5b74f1a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)

// GoldenTokens are the 32 tokens of the golden BlockStored (two blocks of 16): a real
// Qwen3 chat prefix, then 1000..1015.
func goldenTokens() []uint32 {
	t := []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667}
	for i := uint32(1000); i < 1016; i++ {
		t = append(t, i)
	}
	return t
}

const goldenTS = 1789095808.8378847

func goldenStored() *Batch {
	return &Batch{TS: goldenTS, HasDPRank: true, Events: []Event{{
		Type:        TypeBlockStored,
		BlockHashes: []Hash{Uint(0xc1eea2c389c3760d), Uint(0x60b6a6999a5b74f1)},
		TokenIDs:    goldenTokens(), BlockSize: 16, Medium: "GPU",
		ExtraKeys: []any{nil, nil}, SpecKind: "full_attention",
	}}}
}

func goldenRemoved() *Batch {
	return &Batch{TS: goldenTS, HasDPRank: true, Events: []Event{
		{Type: TypeBlockRemoved, BlockHashes: []Hash{Uint(0x60b6a6999a5b74f1)}, Medium: "GPU"},
		{Type: TypeAllBlocksCleared},
	}}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenDecode(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
		want      *Batch
	}{
		{"stored map (vLLM 0.26)", goldenStoredMap, goldenStored()},
		{"stored legacy array", goldenStoredArray, goldenStored()},
		{"removed + cleared map", goldenRemovedMap, goldenRemoved()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(unhex(t, tc.hex))
			if err != nil {
				t.Fatalf("golden payload must decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// The encoder must write exactly what vLLM writes, so that the simulator's events are
// indistinguishable from a real worker's.
func TestGoldenEncode(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
		b         *Batch
		opt       EncodeOptions
	}{
		{"stored map", goldenStoredMap, goldenStored(), EncodeOptions{}},
		{"stored array", goldenStoredArray, goldenStored(), EncodeOptions{Format: FormatArray}},
		{"removed map", goldenRemovedMap, goldenRemoved(), EncodeOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EncodeWith(tc.b, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if want := unhex(t, tc.hex); !bytes.Equal(got, want) {
				t.Fatalf("encoded\n%x\nwant (vLLM)\n%x", got, want)
			}
		})
	}
}

func TestRoundTripVersions(t *testing.T) {
	win := int64(4096)
	lora := int64(3)
	parent := Int(-42)
	b := &Batch{TS: 12.5, DPRank: 2, HasDPRank: true, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []Hash{Int(-7), Bin(bytes.Repeat([]byte{0xab}, 32))}, Parent: &parent,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAID: &lora, Medium: "CPU", LoRAName: "ad",
			ExtraKeys: []any{[]any{"ad", "salt"}, nil}, GroupIdx: 1, SpecKind: "sliding_window", SlidingWindow: &win},
		{Type: TypeBlockRemoved, BlockHashes: []Hash{Uint(9)}, Medium: "GPU", GroupIdx: 1},
		{Type: TypeAllBlocksCleared},
	}}
	for _, opt := range []EncodeOptions{{}, {Format: FormatArray}, {BatchMap: true}, {Format: FormatArray, BatchMap: true}} {
		p, err := EncodeWith(b, opt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("%+v: %v", opt, err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("%+v: round trip\n%+v\nwant\n%+v", opt, got, b)
		}
	}
	// 2-element batch: no rank.
	p, _ := EncodeWith(&Batch{TS: 1, Events: []Event{{Type: TypeAllBlocksCleared}}}, EncodeOptions{BatchLen: 2})
	got, err := Decode(p)
	if err != nil || got.HasDPRank || len(got.Events) != 1 {
		t.Fatalf("2-element batch: %+v %v", got, err)
	}
}

// Older vLLM wrote shorter positional arrays (fields were added over time); the
// decoder must take every length and leave missing fields at their defaults.
func TestLegacyArrayLengths(t *testing.T) {
	base := goldenStored()
	for n := 6; n <= 12; n++ {
		p, err := EncodeWith(base, EncodeOptions{Format: FormatArray, StoredLen: n, RemovedLen: 2})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("len %d: %v", n, err)
		}
		e := got.Events[0]
		if len(e.BlockHashes) != 2 || e.BlockSize != 16 || len(e.TokenIDs) != 32 {
			t.Fatalf("len %d: %+v", n, e)
		}
		if (n >= 7) != (e.Medium == "GPU") || (n >= 11) != (e.SpecKind == "full_attention") {
			t.Fatalf("len %d: medium %q kind %q", n, e.Medium, e.SpecKind)
		}
	}
}

func TestUnknownKeysIgnored(t *testing.T) {
	// {"ts":1.0,"events":[{"type":"BlockRemoved","future":[1,2],"block_hashes":[5]}],"x":{}}
	// built with the library itself: a map batch with unknown keys at both levels.
	p, err := EncodeWith(&Batch{TS: 1, Events: []Event{{Type: TypeBlockRemoved, BlockHashes: []Hash{Uint(5)}}}}, EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Insert an unknown key: rebuild by hand with msgpack primitives.
	p2 := withUnknownKeys(t)
	for _, pl := range [][]byte{p, p2} {
		b, err := Decode(pl)
		if err != nil {
			t.Fatal(err)
		}
		if b.Events[0].Type != TypeBlockRemoved || b.Events[0].BlockHashes[0].ID != 5 {
			t.Fatalf("%+v", b)
		}
	}
}

func TestMalformed(t *testing.T) {
	good := unhex(t, goldenStoredMap)
	cases := map[string][]byte{
		"empty":       {},
		"truncated":   good[:len(good)-10],
		"trailing":    append(append([]byte{}, good...), 0x01),
		"not a batch": {0xa3, 'a', 'b', 'c'},
		"1-element":   {0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		"4-element":   {0x94, 0x00, 0x90, 0x00, 0x00},
		"event int":   {0x93, 0x00, 0x91, 0x05, 0x00},
		"no type":     {0x93, 0x00, 0x91, 0x80, 0x00},
	}
	for name, pl := range cases {
		if _, err := Decode(pl); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

// llm-d-inference-sim writes parent_block_hash 0 (not nil) for a sequence's first
// block in its array format; the decoder must read it as no parent.
func TestZeroParentIsNoParent(t *testing.T) {
	zero := Uint(0)
	for _, opt := range []EncodeOptions{{}, {Format: FormatArray}} {
		p, err := EncodeWith(&Batch{TS: 1, Events: []Event{{Type: TypeBlockStored, BlockHashes: []Hash{Uint(5)},
			Parent: &zero, TokenIDs: []uint32{1, 2}, BlockSize: 2}}}, opt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("%+v: %v", opt, err)
		}
		if got.Events[0].Parent != nil {
			t.Fatalf("%+v: parent 0 decoded as %+v, want nil", opt, *got.Events[0].Parent)
		}
	}
}
