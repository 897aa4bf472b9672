package bench

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSharedPrefixIsDeterministicAndShaped(t *testing.T) {
	o := SharedPrefixOptions{Prefixes: 4, PrefixTokens: 100, SuffixTokens: 10, OutputTokens: 5, Requests: 50, Seed: 3}
	a, b := SharedPrefix(o), SharedPrefix(o)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different workloads")
	}
	o.Seed = 4
	if reflect.DeepEqual(a, SharedPrefix(o)) {
		t.Fatal("different seeds, same workload")
	}
	systems := map[string]bool{}
	for _, it := range a.Items {
		if len(it.Messages) != 2 || it.Messages[0].Role != "system" || len(it.Messages[0].Tokens) != 100 ||
			it.Messages[1].Role != "user" || len(it.Messages[1].Tokens) != 10 || it.MaxTokens != 5 {
			t.Fatalf("item %+v", it)
		}
		systems[string(u32bytes(it.Messages[0].Tokens))] = true
	}
	if len(systems) != 4 {
		t.Errorf("%d distinct system prompts, want 4", len(systems))
	}
	// Engine tokens: ChatML around both messages.
	if n := len(a.Items[0].EngineTokens()); n != 5+100+5+10+3 {
		t.Errorf("engine tokens %d", n)
	}
}

func u32bytes(xs []uint32) []byte {
	out := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		out = append(out, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return out
}

func TestMultiTurnPromptsGrow(t *testing.T) {
	w := MultiTurn(MultiTurnOptions{Conversations: 2, Turns: 3, SystemTokens: 20, UserTokens: 5, OutputTokens: 4, Think: time.Second, Seed: 1})
	if len(w.Items) != 6 {
		t.Fatalf("%d items", len(w.Items))
	}
	prev := w.Items[0].EngineTokens()
	for _, it := range w.Items[1:3] {
		cur := it.EngineTokens()
		// The previous turn's prompt minus its generation prompt (3 tokens) is a prefix.
		if !reflect.DeepEqual(cur[:len(prev)-3], prev[:len(prev)-3]) || len(cur) <= len(prev) {
			t.Fatalf("turn %d does not extend turn %d", it.Turn, it.Turn-1)
		}
		prev = cur
	}
	cs := chains(w)
	if len(cs) != 2 || !reflect.DeepEqual(cs[0], []int{0, 1, 2}) {
		t.Fatalf("chains %v", cs)
	}
}

func TestArrivals(t *testing.T) {
	w := SharedPrefix(SharedPrefixOptions{Prefixes: 2, PrefixTokens: 10, SuffixTokens: 2, OutputTokens: 1, Requests: 2000, Seed: 1})
	c := Arrivals{Kind: "constant", Rate: 4}.Apply(w)
	if c.Items[3].At != 750*time.Millisecond {
		t.Errorf("constant: item 3 at %v", c.Items[3].At)
	}
	p1 := Arrivals{Kind: "poisson", Rate: 4, Seed: 9}.Apply(w)
	p2 := Arrivals{Kind: "poisson", Rate: 4, Seed: 9}.Apply(w)
	if !reflect.DeepEqual(p1, p2) {
		t.Error("poisson not deterministic by seed")
	}
	last := p1.Items[len(p1.Items)-1].At.Seconds()
	if rate := float64(len(p1.Items)-1) / last; math.Abs(rate-4) > 0.4 {
		t.Errorf("poisson mean rate %.2f, want ~4", rate)
	}
	for _, bad := range []string{"constant:0", "poisson:x", "streams:-1", "bursty:3", "constant", "trace:-1s", "trace:3"} {
		if _, err := ParseArrivals(bad, 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if a, err := ParseArrivals("streams:8", 1); err != nil || a.Streams != 8 || a.String() != "streams:8" {
		t.Errorf("streams:8 → %+v %v", a, err)
	}
}

// trace:D delays each trace arrival by a seeded uniform draw in [0, D): a trace rounded
// to 3 s (all arrivals at 0 or 3 s) comes out spread over [0, 3 s) and [3 s, 6 s),
// the same for the same seed; plain trace keeps the times.
func TestTraceArrivalSpread(t *testing.T) {
	w := &Workload{}
	for i := range 200 {
		w.Items = append(w.Items, Item{Conv: -1, At: time.Duration(i/100) * 3 * time.Second})
	}
	a, err := ParseArrivals("trace:3s", 7)
	if err != nil || a.Spread != 3*time.Second || a.String() != "trace:3s" {
		t.Fatalf("trace:3s → %+v %v", a, err)
	}
	got := a.Apply(w)
	distinct := map[time.Duration]bool{}
	for i, it := range got.Items {
		lo := w.Items[i].At
		if it.At < lo || it.At >= lo+3*time.Second {
			t.Fatalf("item %d at %v, want in [%v, %v)", i, it.At, lo, lo+3*time.Second)
		}
		distinct[it.At] = true
	}
	if len(distinct) < 190 {
		t.Errorf("%d distinct arrival times of 200, want them spread", len(distinct))
	}
	if again := a.Apply(w); !reflect.DeepEqual(again, got) {
		t.Error("trace spread not deterministic by seed")
	}
	plain, _ := ParseArrivals("trace", 7)
	if same := plain.Apply(w); !reflect.DeepEqual(same.Items, w.Items) || plain.String() != "trace" {
		t.Error("plain trace arrivals changed the trace's times")
	}
}

const traceSample = `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 500, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]}

{"timestamp": 2000, "input_length": 100, "output_length": 5, "hash_ids": [3]}
`

func TestParseMooncake(t *testing.T) {
	w, err := ParseMooncake(strings.NewReader(traceSample), TraceOptions{Speed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Items) != 3 {
		t.Fatalf("%d items", len(w.Items))
	}
	a, b := w.Items[0], w.Items[1]
	if len(a.Prompt) != 1000 || len(b.Prompt) != 600 || b.MaxTokens != 1 || b.At != 250*time.Millisecond || w.Items[2].At != time.Second {
		t.Fatalf("items %d/%d tokens, max %d, at %v %v", len(a.Prompt), len(b.Prompt), b.MaxTokens, b.At, w.Items[2].At)
	}
	// Equal hash ids at equal positions give equal tokens; different ids differ.
	if !reflect.DeepEqual(a.Prompt[:512], b.Prompt[:512]) || reflect.DeepEqual(a.Prompt[512:600], b.Prompt[512:600]) {
		t.Error("hash id → tokens mapping is wrong")
	}
	if !reflect.DeepEqual(HashIDTokens(5), HashIDTokens(5)) {
		t.Error("HashIDTokens not deterministic")
	}
	w, _ = ParseMooncake(strings.NewReader(traceSample), TraceOptions{Limit: 2})
	if len(w.Items) != 2 {
		t.Errorf("limit: %d items", len(w.Items))
	}
	w, _ = ParseMooncake(strings.NewReader(traceSample), TraceOptions{MaxDuration: time.Second})
	if len(w.Items) != 2 {
		t.Errorf("max duration: %d items", len(w.Items))
	}
	for _, bad := range []string{`{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}`,
		`{"input_length": 10, "hash_ids": [0]}`, `{nope`, `{"timestamp": 0, "input_length": 0, "hash_ids": [1]}`} {
		if _, err := ParseMooncake(strings.NewReader(bad), TraceOptions{}); !errors.Is(err, ErrTrace) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestHitBound(t *testing.T) {
	w := &Workload{Items: []Item{
		{Conv: -1, Prompt: seq(0, 64)},
		{Conv: -1, At: 1, Prompt: seq(0, 64)}, // identical: 3 of 4 blocks (≤ len−1)
		{Conv: -1, At: 2, Prompt: seq(0, 80)}, // 4 blocks of 5 hit
	}}
	want := float64(48+64) / float64(64+64+80)
	if got := HitBound(w, 16); math.Abs(got-want) > 1e-9 {
		t.Errorf("bound %.4f, want %.4f", got, want)
	}
}

func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}
