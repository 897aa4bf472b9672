package kvindex

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestHashBlocksDefinition: HashBlocks computes Key_i = xxhash64(Key_{i−1} ‖ the
// block's ids, little endian) for every full block, whatever the block size (one over
// its 256-id stack buffer included), ignores a trailing partial block, and keeps the
// values it had when it packed the ids one by one (keys are exchanged between
// replicas: index summaries).
func TestHashBlocksDefinition(t *testing.T) {
	tk := make([]uint32, 1000)
	for i := range tk {
		tk[i] = uint32(i*2654435761) ^ 0xdeadbeef
	}
	seed := Namespace{Model: "qwen3"}.Seed()
	for _, bs := range []int{1, 3, 16, 300} {
		got := HashBlocks(seed, tk, bs, nil)
		if len(got) != len(tk)/bs {
			t.Fatalf("block size %d: %d keys, want %d", bs, len(got), len(tk)/bs)
		}
		parent := seed
		for i, k := range got {
			b := binary.LittleEndian.AppendUint64(nil, uint64(parent))
			for _, id := range tk[i*bs : (i+1)*bs] {
				b = binary.LittleEndian.AppendUint32(b, id)
			}
			if parent = Key(xxhash.Sum64(b)); k != parent {
				t.Fatalf("block size %d, block %d: key %#x, definition %#x", bs, i, k, parent)
			}
		}
	}
	if got := HashBlocks(seed, tk[:40], 16, nil); len(got) != 2 || got[0] != 0x6ba9c24abe209d96 || got[1] != 0x5c9b13a22758b102 {
		t.Fatalf("keys changed: %#x", got)
	}
	if got := HashBlocks(seed, tk[:40], 3, nil)[12]; got != 0x3db22a2a5709f00f {
		t.Fatalf("key changed: %#x", got)
	}
}
