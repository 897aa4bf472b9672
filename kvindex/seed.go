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

func newHashSeed() [2]uint64 {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("kvindex: no randomness for the table seed: " + err.Error())
	}
	return [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:]) | 1}
}

// mix is the keyed hash that places a key in its shard and table slot, as Go's
// runtime hashes 64-bit map keys where it has no AES (runtime/hash64.go
// memhash64Fallback, from wyhash, github.com/wangyi-fudan/wyhash): mum(mum(k ⊕ s₀,
// k ⊕ s₁), m₅ ⊕ 8), mum being the folded 64×64→128-bit multiply (high word xor low
// word). The inner product is quadratic in k, so sequential or lattice-shaped keys do
// not map to a lattice of slots (one round of (k ⊕ s₀)·s₁ measured clustered
// sequential keys); which keys share a slot cannot be predicted without the seed.
// Two multiplies per key.
func mix(k uint64) uint64 {
	return mum(mum(k^hashSeed[0], k^hashSeed[1]), 0xa0761d6478bd642f^8)
}

func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
