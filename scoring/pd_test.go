package scoring

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// pdCands: prefill workers p0, p1 and decode workers d0, d1 (sorted by name), each
// booked with the given uncached prefill tokens.
func pdCands(pBooked, dBooked int) []Candidate {
	cs := []Candidate{cand("d0", 0, dBooked), cand("d1", 0, dBooked), cand("p0", 0, pBooked), cand("p1", 0, pBooked)}
	for i := range cs {
		cs[i].Worker.Role = workers.RoleDecode
		if i >= 2 {
			cs[i].Worker.Role = workers.RolePrefill
		}
	}
	return cs
}

func pdPredictor(mod func(*Options)) *Predictor {
	o := Options{Rand: seeded(1)}
	if mod != nil {
		mod(&o)
	}
	return NewPredictor(o.withDefaults(), false)
}

// A long prompt on an idle pool is prefilled remotely: the pair's prediction is the
// prefill worker's plus the transfer, KVTransferLatency + P × B ÷ BW + the decode
// worker's overhead.
func TestPickPairLongPromptRemote(t *testing.T) {
	p := pdPredictor(nil)
	cs := pdCands(0, 0)
	in := input(32768)
	d := p.PickPair(in, cs)
	if d.Prefill < 2 || d.Index > 1 {
		t.Fatalf("pick decode %d, prefill %d; want a decode worker (0, 1) and a prefill worker (2, 3)", d.Index, d.Prefill)
	}
	bytes := 32768.0 * 131072
	want := 2*time.Millisecond + time.Duration(bytes/25e9*float64(time.Second)) + 20*time.Millisecond
	if got := d.Predicted.Transfer; got < want-time.Microsecond || got > want+time.Microsecond {
		t.Fatalf("transfer %v, want %v", got, want)
	}
	if d.Predicted.TTFT != d.PrefillPredicted.TTFT+d.Predicted.Transfer {
		t.Fatalf("pair TTFT %v ≠ prefill %v + transfer %v", d.Predicted.TTFT, d.PrefillPredicted.TTFT, d.Predicted.Transfer)
	}
	// The decode worker's cached prefix is not transferred.
	cs[0].CachedTokens, cs[1].CachedTokens = 16384, 16384
	d2 := p.PickPair(in, cs)
	if d2.Predicted.Transfer >= d.Predicted.Transfer {
		t.Fatalf("transfer with half the prompt cached on the decode worker %v, want < %v", d2.Predicted.Transfer, d.Predicted.Transfer)
	}
}

// A short prompt facing a long prefill queue is prefilled on the decode worker (the
// conditional choice); past PDMaxLocalPrefillTokens it goes remote whatever the queue,
// unless the cap is off.
func TestPickPairConditionalLocal(t *testing.T) {
	p := pdPredictor(nil)
	d := p.PickPair(input(512), pdCands(200000, 0))
	if d.Prefill != -1 || d.Index > 1 {
		t.Fatalf("short prompt behind a 200k-token prefill queue: decode %d prefill %d, want local on a decode worker", d.Index, d.Prefill)
	}
	if d.Predicted.Transfer != 0 {
		t.Fatalf("a local prefill has transfer %v", d.Predicted.Transfer)
	}
	d = p.PickPair(input(4096), pdCands(200000, 0))
	if d.Prefill < 2 {
		t.Fatalf("4096 uncached tokens > the 1000-token cap went local (prefill %d)", d.Prefill)
	}
	nocap := pdPredictor(func(o *Options) { o.PDMaxLocalPrefillTokens = -1 })
	if d := nocap.PickPair(input(4096), pdCands(200000, 0)); d.Prefill != -1 {
		t.Fatalf("without the cap a faster local prefill went remote (prefill %d)", d.Prefill)
	}
	// An idle prefill pool wins for a mid-size prompt: transfer is cheaper than the
	// decode worker's own queue.
	if d := p.PickPair(input(900), pdCands(0, 50000)); d.Prefill < 2 {
		t.Fatalf("900 tokens with the decode workers' queues at 50k went local (prefill %d)", d.Prefill)
	}
}

// The decode worker is chosen by decode load: near-tie options go to the worker with
// the least KV footprint, and one where the request's KV does not fit comes last.
func TestPickPairDecodeByKVLoad(t *testing.T) {
	p := pdPredictor(nil)
	cs := pdCands(0, 0)
	for i := range cs {
		cs[i].Worker.Profile.BlockCapacity = 10000 // 160k tokens
	}
	cs[0].Booked = Booked{Requests: 3, Decoding: 3, KVTokens: 100000}
	cs[1].Booked = Booked{Requests: 3, Decoding: 3, KVTokens: 20000}
	in := input(16384)
	in.MaxTokens = 256
	if d := p.PickPair(in, cs); d.Index != 1 {
		t.Fatalf("decode %d, want d1 (20k of 160k KV tokens, d0 holds 100k)", d.Index)
	}
	cs[1].Booked.KVTokens, cs[1].Booked.Decoding = 150000, 1 // the request no longer fits on d1
	if d := p.PickPair(in, cs); d.Index != 0 {
		t.Fatalf("decode %d, want d0 (the request does not fit on d1)", d.Index)
	}
}

// Both-role workers pair only with another worker; an aggregated worker only serves
// alone; a pool of prefill workers only answers nothing.
func TestPickPairRoles(t *testing.T) {
	p := pdPredictor(nil)
	cs := []Candidate{cand("a", 0, 300000), cand("b", 0, 0), cand("c", 0, 0)}
	cs[0].Worker.Role, cs[1].Worker.Role, cs[2].Worker.Role = workers.RoleBoth, workers.RoleBoth, workers.RoleAggregated
	for i := 0; i < 20; i++ {
		d := p.PickPair(input(20000), cs)
		if d.Index < 0 || d.Prefill == d.Index || (d.Prefill >= 0 && !cs[d.Prefill].Worker.Role.Prefills()) ||
			(d.Prefill >= 0 && !cs[d.Index].Worker.Role.ReceivesKV()) {
			t.Fatalf("pair decode %d prefill %d breaks the roles", d.Index, d.Prefill)
		}
	}
	only := []Candidate{cand("p", 0, 0)}
	only[0].Worker.Role = workers.RolePrefill
	if d := p.PickPair(input(100), only); d.Index != -1 {
		t.Fatalf("prefill-only pool answered with %d", d.Index)
	}
}

// Absurd sizes saturate: no term overflows into a negative or wrapped duration.
func TestPickPairSaturates(t *testing.T) {
	p := pdPredictor(func(o *Options) { o.KVTransferBytesPerSecond = 1e-9 })
	d := p.PickPair(input(1<<40), pdCands(1<<50, 0))
	if d.Index < 0 {
		t.Fatal("no pick")
	}
	if d.Predicted.TTFT <= 0 || d.Predicted.Transfer < 0 || d.Predicted.Transfer > MaxPredictedTerm {
		t.Fatalf("prediction %v / transfer %v out of bounds", d.Predicted.TTFT, d.Predicted.Transfer)
	}
}

// llmd_pd disaggregates from PDNonCachedTokens uncached tokens on the decode worker it
// picked first (decode profile: prefix, queue, KV), then picks the prefill worker by
// the same scorers among the prefill workers.
func TestLLMDPDThreshold(t *testing.T) {
	p := mustNew(PolicyLLMDPD, Options{Rand: seeded(2)}).(*LLMDPD)
	cs := pdCands(0, 0)
	if d := p.PickPair(input(512), cs); d.Prefill != -1 || d.Index > 1 {
		t.Fatalf("512 tokens (< 1024): decode %d prefill %d, want decode alone", d.Index, d.Prefill)
	}
	cs[0].CachedTokens = 30000 // d0 caches most of the prompt: it wins the decode profile
	d := p.PickPair(input(32000), cs)
	if d.Index != 0 || d.Prefill < 2 {
		t.Fatalf("32000 tokens: decode %d prefill %d, want d0 with a prefill worker", d.Index, d.Prefill)
	}
	cs[0].CachedTokens = 31500 // 500 uncached on d0: under the threshold
	if d := p.PickPair(input(32000), cs); d.Index != 0 || d.Prefill != -1 {
		t.Fatalf("500 uncached: decode %d prefill %d, want d0 alone", d.Index, d.Prefill)
	}
}

// The pair pick refuses by the aggregated pick's rule (refusal) on the options a
// request can be sent to: the pair's TTFT with its transfer, or a decode worker's local
// prefill — not on the prefill leg alone.
func TestPickPairRefusesOnThePairsPrediction(t *testing.T) {
	// A slow link: the prefill leg is fast, the transfer is not; the 4096-token prompt
	// is past the local-prefill cap, so only the remote option exists.
	p := pdPredictor(func(o *Options) { o.KVTransferBytesPerSecond = 1e9 })
	in := input(4096)
	in.SLO, in.RefuseOnSLOMiss = 2*time.Second, true
	ok := p.PickPair(in, pdCands(0, 0))
	if ok.Shed || ok.Prefill < 0 {
		t.Fatalf("without a threshold: %+v, want a remote pair", ok)
	}
	if ok.Predicted.Transfer < 500*time.Millisecond || ok.PrefillPredicted.TTFT+ok.Predicted.Transfer != ok.Predicted.TTFT {
		t.Fatalf("prefill leg %v, pair %v: want a transfer ≥ 0.5 s inside the pair's TTFT", ok.PrefillPredicted.TTFT, ok.Predicted)
	}
	in.RefuseAbove = (ok.PrefillPredicted.TTFT + ok.Predicted.TTFT) / 2 // the leg within, the pair past
	d := p.PickPair(in, pdCands(0, 0))
	if !d.Shed || d.Reason != ReasonSLO || d.Index != -1 || d.Prefill != -1 {
		t.Fatalf("pair past the threshold: %+v, want refused with reason slo", d.Decision)
	}
	if want := ok.Predicted.TTFT - in.RefuseAbove; d.RetryAfter != max(want, time.Second) {
		t.Fatalf("Retry-After %v, want the pair's excess %v (at least 1 s)", d.RetryAfter, want)
	}
	// A short prompt behind a long prefill queue: the prefill workers alone would be
	// refused, the decode worker's local prefill is within the threshold.
	in = input(512)
	in.SLO, in.RefuseOnSLOMiss, in.RefuseAbove = 2*time.Second, true, time.Second
	d = p.PickPair(in, pdCands(200000, 0))
	if d.Shed || d.Index < 0 || d.Prefill != -1 {
		t.Fatalf("local option within the threshold: %+v prefill %d, want admitted locally", d.Decision, d.Prefill)
	}
	// MaxTTFT sheds the same way.
	mt := pdPredictor(func(o *Options) {
		o.KVTransferBytesPerSecond, o.MaxTTFT = 1e9, ok.PrefillPredicted.TTFT+time.Millisecond
	})
	if d := mt.PickPair(input(4096), pdCands(0, 0)); !d.Shed {
		t.Fatalf("pair past max_ttft: %+v, want shed", d.Decision)
	}
}

// The transfer bandwidth is learned only when asked: an EWMA of observed bytes ÷ the
// wire time (the observed transfer less the prediction's other terms), within 1/8× to
// 8× the configured bandwidth; a transfer of no bytes or no wire time teaches nothing.
func TestObserveTransferLearnsBandwidth(t *testing.T) {
	off := pdPredictor(nil)
	off.ObserveTransfer(1000, 1e6, time.Second, 50*time.Millisecond)
	if got := off.TransferBandwidth(); got != 25e9 {
		t.Fatalf("bandwidth with learning off %g, want the configured 25e9", got)
	}
	p := pdPredictor(func(o *Options) { o.KVTransferLearnWeight = 0.5 })
	// 1 GB predicted at 25 GB/s (40 ms) + 10 ms of other terms; observed 1.01 s: the
	// wire took 1 s, 1 GB/s — under the 1/8× floor (3.125 GB/s), so the floor counts.
	p.ObserveTransfer(1000, 1e6, 1010*time.Millisecond, 50*time.Millisecond)
	if got, want := p.TransferBandwidth(), 0.5*25e9+0.5*25e9/8; got != want {
		t.Fatalf("bandwidth after one slow transfer %g, want %g", got, want)
	}
	before := p.TransferBandwidth()
	p.ObserveTransfer(0, 1e6, time.Second, 0)                         // no bytes
	p.ObserveTransfer(1000, 1e6, 500*time.Millisecond, 2*time.Second) // other terms over-predicted: no wire time
	if p.TransferBandwidth() != before {
		t.Fatal("a transfer of no bytes or no wire time moved the bandwidth")
	}
	// The learned bandwidth reaches the pair's predicted transfer.
	fresh := pdPredictor(nil)
	in := input(32768)
	if slow, fast := p.PickPair(in, pdCands(0, 0)).Predicted.Transfer, fresh.PickPair(in, pdCands(0, 0)).Predicted.Transfer; slow <= fast {
		t.Fatalf("transfer with the learned bandwidth %v, want > %v at the configured one", slow, fast)
	}
}
