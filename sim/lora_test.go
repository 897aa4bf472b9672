package sim

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

func loraProfile(max int) Profile {
	p := testProfile()
	p.MaxLoRAs, p.LoRALoadTime = max, 50*time.Millisecond
	return p
}

func TestLoRALoadAddsToTheStepAndSlotsAreLRU(t *testing.T) {
	e := mustEngine(t, loraProfile(2))
	n := 0
	run := func(adapter string) time.Duration {
		t.Helper()
		n++
		if err := e.Add(&Request{ID: adapter + strconv.Itoa(n), Prompt: seqTokens(1000*n, 20), MaxTokens: 1, LoRA: adapter}); err != nil {
			t.Fatal(err)
		}
		_, _, total := drain(t, e)
		return total
	}
	cold := run("a")
	warm := run("a")
	if cold-warm != 50*time.Millisecond {
		t.Fatalf("first request of a takes %v, second %v: the load must add exactly 50ms", cold, warm)
	}
	run("b")
	run("c") // evicts a, the least recently used
	if got := e.LoRASlots(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("slots %v, want [b c]", got)
	}
	if got := e.Stats().LoRALoads; got != 3 {
		t.Fatalf("loads %d, want 3 (a, b, c)", got)
	}
	if err := mustEngine(t, testProfile()).Add(&Request{ID: "x", Prompt: seqTokens(1, 4), LoRA: "a"}); !errors.Is(err, ErrNoLoRA) {
		t.Fatalf("adapter on an engine without slots: %v", err)
	}
}

// One step runs at most max_loras distinct adapters: a request of a further adapter
// waits (skipped, not blocking base-model requests behind it) until a slot's adapter
// has no running request.
func TestLoRAMaxLorasPerStep(t *testing.T) {
	e := mustEngine(t, loraProfile(1))
	long := &Request{ID: "long", Prompt: seqTokens(1, 4), MaxTokens: 20, LoRA: "a"}
	other := &Request{ID: "other", Prompt: seqTokens(100, 4), MaxTokens: 1, LoRA: "b"}
	base := &Request{ID: "base", Prompt: seqTokens(200, 4), MaxTokens: 1}
	for _, r := range []*Request{long, other, base} {
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	_, outs, _, _ := e.Step()
	st := e.Stats()
	if !slices.Equal(st.RunningLoRAs, []string{"a"}) || !slices.Equal(st.WaitingLoRAs, []string{"b"}) {
		t.Fatalf("running %v waiting %v, want [a] and [b]", st.RunningLoRAs, st.WaitingLoRAs)
	}
	gotBase := false
	for _, o := range outs {
		gotBase = gotBase || o.Req == base
	}
	if !gotBase {
		t.Fatalf("the base-model request behind the blocked adapter was not scheduled")
	}
	outs, _, _ = drain(t, e)
	var longDone, otherFirst int
	for i, o := range outs {
		if o.Req == long && o.Finished {
			longDone = i
		}
		if o.Req == other && o.First {
			otherFirst = i
		}
	}
	if otherFirst < longDone {
		t.Fatalf("b ran (output %d) before a's request finished (output %d)", otherFirst, longDone)
	}
}

func TestLoRABlocksHashApartAndCarryTheAdapter(t *testing.T) {
	e := mustEngine(t, loraProfile(2))
	tk := seqTokens(1, 33)
	_ = e.Add(&Request{ID: "x", Prompt: tk, MaxTokens: 1, LoRA: "a"})
	_, evA, _ := drain(t, e)
	_ = e.Add(&Request{ID: "y", Prompt: tk, MaxTokens: 1})
	outs, evB, _ := drain(t, e)
	if outs[0].CachedTokens != 0 {
		t.Fatalf("a base-model request hit the adapter's blocks (%d tokens)", outs[0].CachedTokens)
	}
	if len(evA) == 0 || evA[0].LoRA != "a" || evB[0].LoRA != "" || evA[0].Hashes[0] == evB[0].Hashes[0] {
		t.Fatalf("adapter events %+v / base %+v", evA, evB)
	}
	w := WireBatch(Batch{Events: evA[:1]}).Events[0]
	if w.LoRAName != "a" || w.LoRAID == nil || len(w.ExtraKeys) != 2 {
		t.Fatalf("wire event: %+v", w)
	}
	for _, x := range w.ExtraKeys {
		if xs := x.([]any); len(xs) != 1 || xs[0] != "a" {
			t.Fatalf("every block's extra keys start with the adapter name: %v", w.ExtraKeys)
		}
	}
}
