package kvindex

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
)

// hashSeed keys mix. Block keys come from parties kvroute does not control: a KV
// event publisher chooses the engine block hashes (rank tables) and the tokens whose
// chained hashes are the index keys, and a peer's summary lists index keys outright.
// With a fixed mapping from key to table slot such a party can pick keys that share
// one home slot (for the former multiply-by-constant: k·φ⁻¹ for k = 1, 2, …; for raw
// top bits: 1, 2, 3, …) and turn every probe into a scan of the whole table. Drawn
// once per process from crypto/rand, the seed is unknown outside it; slots are never
// persisted or exchanged, so replicas need not agree on it.
var hashSeed = newHashSeed()

func newHashSeed() [3]uint64 {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("kvindex: no randomness for the table seed: " + err.Error())
	}
	return [3]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:16]) | 1, binary.LittleEndian.Uint64(b[16:]) | 1}
}

// mix is the keyed hash that places a key in its shard and table slot, as Go's
// runtime hashes 64-bit map keys where it has no AES (runtime/hash64.go
// memhash64Fallback, from wyhash, github.com/wangyi-fudan/wyhash): mum(mum(k ⊕ s₀,
// k ⊕ s₁), s₂), mum being the folded 64×64→128-bit multiply (high word xor low word).
// The inner product is quadratic in k and the fold feeds high bits back into low
// ones, so sequential keys, arithmetic progressions and keys differing only in their
// top bits spread like random ones. Measured weaker, each clustering such keys for
// some seeds: (k ⊕ s₀)·s₁ (Dietzfelbinger multiply-shift: pairwise-universal, but a
// Weyl sequence for j·D), and (k ⊕ s₀)·s₁ then an xorshift-multiply. Cost: every
// probe step recomputes the home of the slot's key (Robin Hood distance), so the two
// multiplies are paid per probe: BenchmarkLookup cpu-ns/op +30–40 % against the
// unkeyed placement, +15 % for the single multiply (interleaved A/B runs of
// go test -bench Lookup).
func mix(k uint64) uint64 {
	hi, lo := bits.Mul64(k^hashSeed[0], k^hashSeed[1])
	hi, lo = bits.Mul64(hi^lo, hashSeed[2])
	return hi ^ lo
}
