package scoring

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/workers"
)

func TestNewKnowsEveryPolicyName(t *testing.T) {
	for _, name := range PolicyNames {
		p, err := New(name, Options{Rand: seeded(1)})
		if err != nil || p.Name() != name {
			t.Fatalf("New(%q) = %v, %v", name, p, err)
		}
		if d := p.Pick(input(100), cands(3)); d.Index < 0 || d.Index >= 3 {
			t.Fatalf("%s: index %d out of range", name, d.Index)
		}
	}
	if _, err := New("nope", Options{}); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown policy error = %v, want ErrUnknownPolicy", err)
	}
}

func TestRandomAndRoundRobin(t *testing.T) {
	rr := mustNew(PolicyRoundRobin, Options{})
	cs := cands(3)
	var got []int
	for k := 0; k < 6; k++ {
		got = append(got, rr.Pick(input(10), cs).Index)
	}
	if want := []int{0, 1, 2, 0, 1, 2}; !equalInts(got, want) {
		t.Fatalf("round robin order %v, want %v", got, want)
	}
	dry := input(10)
	dry.DryRun = true
	if rr.Pick(dry, cs).Index != 0 || rr.Pick(dry, cs).Index != 0 || rr.Pick(input(10), cs).Index != 0 {
		t.Fatal("a dry-run (explain) pick must not advance round robin")
	}
	rnd := mustNew(PolicyRandom, Options{Rand: seeded(3)})
	count := make([]int, 3)
	for k := 0; k < 3000; k++ {
		count[rnd.Pick(input(10), cs).Index]++
	}
	for _, n := range count {
		if n < 900 || n > 1100 {
			t.Fatalf("random is not uniform: %v", count)
		}
	}
}

func TestLeastRequest(t *testing.T) {
	p := mustNew(PolicyLeastRequest, Options{Rand: seeded(1)})
	cs := cands(3)
	cs[0].Booked.Requests, cs[1].Booked.Requests, cs[2].Booked.Requests = 4, 1, 2
	if d := p.Pick(input(10), cs); d.Index != 1 {
		t.Fatalf("least request must pick the fewest in-flight requests: %+v", d)
	}
}

func chat(text string) *Input {
	in := input(len(text) / 4)
	in.Request = &request.Request{API: request.APIChat, Model: "m", Messages: jsonvalue.MessagesOf([]map[string]any{{"role": "user", "content": text}})}
	return in
}

func TestGIEApproxPrefixSticksWhileBalanced(t *testing.T) {
	p := mustNew(PolicyGIE, Options{Rand: seeded(1)})
	cs := cands(4)
	doc := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 100)
	first := p.Pick(chat(doc+"question one"), cs).Index
	for k := 0; k < 5; k++ {
		if d := p.Pick(chat(doc+"another question"), cs); d.Index != first {
			t.Fatalf("same long prefix must follow its LRU entry to worker %d, got %d", first, d.Index)
		}
	}
	// A full queue and KV on that worker outweigh the prefix (3·1 < 2·1 + 2·1 of the others).
	for i := range cs {
		cs[i].Load = workers.Load{ScrapedAt: t0}
	}
	cs[first].Load = workers.Load{Waiting: 20, KVUsage: 1, ScrapedAt: t0}
	if d := p.Pick(chat(doc+"third"), cs); d.Index == first {
		t.Fatalf("queue and KV scorers must outweigh the prefix on a saturated worker: %+v", d)
	}
	if len(charBlocks("short", 64, 256)) != 0 {
		t.Fatal("text shorter than one block has no blocks")
	}
	l := newBlockLRU(2)
	l.add(1)
	l.add(2)
	l.add(3)
	if l.leading([]uint64{1}) != 0 || l.leading([]uint64{2, 3}) != 2 {
		t.Fatal("LRU must evict the least recently added block")
	}
}

func TestLLMDPrefixAffinityUntilSaturated(t *testing.T) {
	p := mustNew(PolicyLLMD, Options{Rand: seeded(1), Baselines: Baselines{SaturationTokens: 10000}})
	cs := []Candidate{cand("hot", 4000, 0), cand("cold1", 0, 0), cand("cold2", 0, 500)}
	for booked := 0; booked < 10000; booked += 2500 {
		cs[0].Booked.PrefillTokens = booked
		if d := p.Pick(input(4096), cs); d.Index != 0 {
			t.Fatalf("must stick to the prefix holder until saturated (booked %d): %+v", booked, d)
		}
	}
	cs[0].Booked.PrefillTokens = 10000
	if d := p.Pick(input(4096), cs); d.Index != 1 {
		t.Fatalf("saturated holder: the least token-loaded unsaturated worker must win: %+v", d)
	}
	cs[0].Booked.PrefillTokens = 0
	cs[0].Load = workers.Load{Waiting: 5, ScrapedAt: t0}
	if d := p.Pick(input(4096), cs); d.Index == 0 {
		t.Fatal("a scraped queue at the threshold saturates the worker")
	}
}

func TestDynamoCost(t *testing.T) {
	p := mustNew(PolicyDynamo, Options{Rand: seeded(1)})
	in := input(1600) // 100 blocks
	cs := []Candidate{cand("hot", 1600, 0), cand("cold", 0, 0)}
	if d := p.Pick(in, cs); d.Index != 0 {
		t.Fatalf("overlap must lower the cost: %+v", d)
	}
	cs[0].Booked.Requests = 3 // 300 decode blocks > 100 prefill blocks saved
	if d := p.Pick(in, cs); d.Index != 1 {
		t.Fatalf("decode load must outweigh overlap: %+v", d)
	}
	// Overlap weight 0: pure load balancing ignores the cache.
	p0 := mustNew(PolicyDynamo, Options{Rand: seeded(1), Baselines: Baselines{DynamoOverlap: -1}})
	cs[0].Booked.Requests, cs[1].Booked.Requests = 0, 1
	if d := p0.Pick(in, cs); d.Index != 0 {
		t.Fatalf("weight 0: least decode load wins: %+v", d)
	}
	// Temperature: softmax sampling picks the costlier worker sometimes, the cheaper more.
	pt := mustNew(PolicyDynamo, Options{Rand: seeded(1), Baselines: Baselines{DynamoTemperature: 0.5}})
	cs[0].Booked.Requests, cs[1].Booked.Requests = 0, 0
	n := 0
	for k := 0; k < 1000; k++ {
		if pt.Pick(in, cs).Index == 0 {
			n++
		}
	}
	if n < 550 || n == 1000 {
		t.Fatalf("softmax: hot chosen %d/1000, want most but not all", n)
	}
}

func TestSGLangCacheAwareThresholds(t *testing.T) {
	p := mustNew(PolicySGLang, Options{Rand: seeded(1), Baselines: Baselines{SGLBalanceAbs: 4, SGLBalanceRel: 1.5}})
	cs := cands(3)
	doc := strings.Repeat("shared system prompt with lots of words. ", 50)
	first := p.Pick(chat(doc+"q1"), cs).Index
	cs[first].Booked.Requests = 3 // balanced still: 3−0 ≤ 4
	if d := p.Pick(chat(doc+"q2"), cs); d.Index != first {
		t.Fatalf("balanced: match above cache_threshold must follow the tree to %d, got %d", first, d.Index)
	}
	cs[first].Booked.Requests = 10 // 10−0 > 4 and 10 > 1.5×0: imbalanced → shortest queue
	if d := p.Pick(chat(doc+"q3"), cs); d.Index == first {
		t.Fatal("imbalanced: shortest queue must win over the cached worker")
	}
	cs[first].Booked.Requests = 0
	// Low match ratio: least loaded (ties random), not the tree.
	cs[(first+1)%3].Booked.Requests = 1
	cs[(first+2)%3].Booked.Requests = 1
	cs[first].Booked.Requests = 2
	if d := p.Pick(chat("completely different text that shares nothing"), cs); d.Index == first {
		t.Fatal("a match below cache_threshold must go to the least-loaded worker")
	}
}

func TestRadixTree(t *testing.T) {
	r := newRadix()
	r.insert("hello world", "a")
	r.insert("hello there", "b")
	if n, h := r.match("hello world!"); n != 11 || len(h) != 1 || h["a"] == 0 {
		t.Fatalf("match = %d %v", n, h)
	}
	if n, h := r.match("hello"); n != 5 || len(h) != 2 {
		t.Fatalf("shared prefix must be held by both: %d %v", n, h)
	}
	if r.size["a"] != 11 || r.size["b"] != 11 {
		t.Fatalf("sizes %v", r.size)
	}
	r.insert("zzzz", "a")
	r.evict("a", 4) // drops "hello world" (older), keeps "zzzz"
	if _, h := r.match("hello world"); h["a"] != 0 {
		t.Fatalf("a's evicted leaf still matches: %v", h)
	}
	if n, h := r.match("zzzz"); n != 4 || h["a"] == 0 || r.size["a"] != 4 {
		t.Fatalf("most recent insert must survive eviction: %d %v size %d", n, h, r.size["a"])
	}
}

func TestPromptText(t *testing.T) {
	in := &Input{Request: &request.Request{System: jsonvalue.StringValue("sys"), Messages: jsonvalue.MessagesOf([]map[string]any{
		{"role": "user", "content": []any{map[string]any{"type": "text", "text": "hi"}, map[string]any{"type": "image_url"}}},
	})}}
	if got := PromptText(in); got != "sys\nuser: hi<image_url>\n" {
		t.Fatalf("chat text %q", got)
	}
	in = &Input{Request: &request.Request{Prompts: []string{"a", "b"}}}
	if got := PromptText(in); got != "a\nb" {
		t.Fatalf("prompts text %q", got)
	}
	in = &Input{Tokens: []uint32{1, 2}}
	if got := PromptText(in); got != "\x01\x00\x00\x00\x02\x00\x00\x00" {
		t.Fatalf("token fallback %q", got)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
