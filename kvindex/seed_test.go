package kvindex

import (
	"math/rand/v2"
	"testing"
)

// maxProbe is the longest distance from home of any entry, and the mean.
func maxProbe(n int, dist func(i int) int, occupied func(i int) bool) (longest int, mean float64) {
	var sum, cnt int
	for i := 0; i < n; i++ {
		if occupied(i) {
			d := dist(i)
			longest, sum, cnt = max(longest, d), sum+d, cnt+1
		}
	}
	return longest, float64(sum) / float64(cnt)
}

// inverse is the multiplicative inverse of odd a modulo 2^64 (Newton's iteration).
func inverse(a uint64) uint64 {
	x := a
	for i := 0; i < 6; i++ {
		x *= 2 - a*x
	}
	return x
}

// keySets are key choices a KV event publisher or a peer could make: sequential
// integers (all in one home under raw top-bit placement), multiples of the inverse of
// the golden-ratio constant (all in one home under multiply-by-φ placement), keys
// differing only in their top bits, and random keys for reference.
func keySets(n int) map[string][]uint64 {
	inv := inverse(0x9E3779B97F4A7C15)
	sets := map[string][]uint64{}
	r := rand.New(rand.NewPCG(1, 2))
	for j := 1; j <= n; j++ {
		sets["sequential"] = append(sets["sequential"], uint64(j))
		sets["inverse_golden"] = append(sets["inverse_golden"], uint64(j)*inv)
		sets["top_bits"] = append(sets["top_bits"], uint64(j)<<40)
		sets["random"] = append(sets["random"], r.Uint64()|1)
	}
	return sets
}

// Chosen keys give probe chains no longer than random ones: every table of the index
// places keys by the per-process seeded mix, so a party choosing keys cannot make them
// share home slots or a shard. Before the mix, each adversarial set put all 50,000 keys
// in one home slot: probe length = the number of keys.
func TestChosenKeysGiveBoundedProbes(t *testing.T) {
	const n = 50000
	// Robin Hood at load ≤ 0.9 with uniform homes: the mean displacement is a few
	// slots and the longest a few tens (it grows like log n); 128 is far above what a
	// uniform placement gives and far below what one shared home gives.
	const maxLongest, maxMean = 128, 5.0
	for name, keys := range keySets(n) {
		var r rh[Key, uint32]
		var k ktab
		shards := make([]int, nShards)
		for _, x := range keys {
			r.insert(x, Key(x), 0)
			k.insert(x, holder{})
			shards[shardOf(Key(x))]++
		}
		rl, rm := maxProbe(len(r.keys), r.dist, func(i int) bool { return r.keys[i] != 0 })
		kl, km := maxProbe(len(k.s), k.dist, func(i int) bool { return k.s[i].k != 0 })
		t.Logf("%s: rank table longest %d mean %.2f; key table longest %d mean %.2f; shards %v", name, rl, rm, kl, km, shards)
		if rl > maxLongest || rm > maxMean || kl > maxLongest || km > maxMean {
			t.Errorf("%s: probe lengths rank %d/%.2f, key %d/%.2f, want ≤ %d longest and ≤ %.0f mean", name, rl, rm, kl, km, maxLongest, maxMean)
		}
		for s, c := range shards { // binomial(50000, 1/32): mean 1563, sd 39
			if c < n/nShards/2 || c > n/nShards*2 {
				t.Errorf("%s: shard %d holds %d of %d keys", name, s, c, n)
			}
		}
		for _, x := range keys { // and every key is still found
			if r.find(x, nil) < 0 || k.find(x) < 0 {
				t.Fatalf("%s: key %#x lost", name, x)
			}
		}
	}
}

// The seed is drawn per process: two draws differ, and the mix under two seeds
// places the same keys differently.
func TestHashSeedIsRandom(t *testing.T) {
	a, b := newHashSeed(), newHashSeed()
	if a == b || a[1]&1 == 0 || b[1]&1 == 0 || a[2]&1 == 0 || b[2]&1 == 0 {
		t.Fatalf("seeds %x and %x: want two different draws with odd multipliers", a, b)
	}
}
