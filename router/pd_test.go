package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// pdFixture: prefill workers p0, p1 and decode workers d0, d1 serving "m" (block size
// 16), a real kvindex, an injected clock, the learning Simple policy.
func pdFixture(t testing.TB) (*fixture, *kvindex.Index) {
	f := &fixture{reg: workers.NewRegistry(), clk: &clock{t: time.Unix(1_700_000_000, 0)}, ms: metrics.NewUnregistered(), pol: &learner{}}
	f.reg.Set([]*workers.Worker{
		{Name: "d0", Address: "10.0.0.1:8000", Models: []string{"m"}, Role: workers.RoleDecode},
		{Name: "d1", Address: "10.0.0.2:8000", Models: []string{"m"}, Role: workers.RoleDecode},
		{Name: "p0", Address: "10.0.0.3:8000", Models: []string{"m"}, Role: workers.RolePrefill},
		{Name: "p1", Address: "10.0.0.4:8000", Models: []string{"m"}, Role: workers.RolePrefill},
	})
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
	f.r = New(Options{Registry: f.reg, Index: ix, Models: []Model{{Name: "m", BlockSize: 16}}, Policy: f.pol,
		TicketTTL: time.Minute, Metrics: f.ms, Now: f.clk.now})
	return f, ix
}

func (f *fixture) pdPick(t *testing.T, n, seed int) *Ticket {
	t.Helper()
	tk, err := f.r.Pick(context.Background(), promptOf(n, seed), PickOptions{Fallbacks: 3})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// On a pool with roles a ticket names a prefill worker and a decode worker and books
// on both: the prefill worker the uncached prompt, the decode worker the request alone.
func TestPDTicketBooksBothWorkers(t *testing.T) {
	f, ix := pdFixture(t)
	tk := f.pdPick(t, 640, 1)
	pw, dw := tk.PrefillWorker, tk.Worker
	if !(pw == "p0" && tk.PrefillAddress == "10.0.0.3:8000" || pw == "p1" && tk.PrefillAddress == "10.0.0.4:8000") ||
		!(dw == "d0" && tk.Address == "10.0.0.1:8000" || dw == "d1" && tk.Address == "10.0.0.2:8000") {
		t.Fatalf("pair %s@%s → %s@%s, want a prefill worker → a decode worker", pw, tk.PrefillAddress, dw, tk.Address)
	}
	if !tk.RemotePrefill() {
		t.Fatal("a fresh pair ticket must prefill remotely")
	}
	if got := f.booked(pw); got.Requests != 1 || got.Prefilling != 1 || got.PrefillTokens != 640 {
		t.Fatalf("prefill worker booked %+v, want one request prefilling 640 tokens", got)
	}
	if got := f.booked(dw); got.Requests != 1 || got.Prefilling != 1 || got.PrefillTokens != 0 {
		t.Fatalf("decode worker booked %+v, want one request and no prefill tokens", got)
	}
	for _, a := range tk.Fallbacks {
		if a == "10.0.0.3:8000" || a == "10.0.0.4:8000" {
			t.Fatalf("fallbacks %v list a prefill-only worker", tk.Fallbacks)
		}
	}
	if ix.Entries() != 2*640/16 {
		t.Fatalf("speculative entries %d, want the prompt's 40 blocks on each worker of the pair", ix.Entries())
	}
	if ws, ts := f.r.Snapshot(); len(ts) != 1 || ts[0].PrefillWorker != pw || ts[0].Worker != dw || ws[0].Role != workers.RoleDecode {
		t.Fatalf("admin view %+v / %+v, want the ticket's prefill worker %s and the workers' roles", ts, ws, pw)
	}
	if got := testutil.ToFloat64(f.ms.Router.PDDecisions.WithLabelValues("remote")); got != 1 {
		t.Fatalf("pd_decisions_total{remote} = %v, want 1", got)
	}
	// The next request pairs the other two: each leg books where it runs.
	tk2 := f.pdPick(t, 320, 2)
	if tk2.PrefillWorker == pw || tk2.Worker == dw || tk2.PrefillWorker == "" {
		t.Fatalf("second pair %s → %s, want the other two workers", tk2.PrefillWorker, tk2.Worker)
	}
	tk.Abort()
	tk2.Abort()
	for _, w := range []string{"p0", "p1", "d0", "d1"} {
		if got := f.booked(w); got.Requests != 0 || got.PrefillTokens != 0 {
			t.Fatalf("%s still booked %+v after both aborts", w, got)
		}
	}
	if ix.Entries() != 0 {
		t.Fatalf("aborts before the first token left %d speculative entries on the pairs", ix.Entries())
	}
}

// PrefillDone(nil) releases the prefill worker and teaches the policy the leg's
// duration as that worker's TTFT; the pair's own first token and completion teach
// nothing more (their prediction was for the pair), and release the decode worker.
func TestPDPrefillDoneLearnsPrefillLeg(t *testing.T) {
	f, _ := pdFixture(t)
	tk := f.pdPick(t, 640, 1)
	f.clk.add(300 * time.Millisecond)
	tk.PrefillDone(nil)
	if got := f.booked(tk.PrefillWorker); got.Requests != 0 || got.PrefillTokens != 0 {
		t.Fatalf("prefill worker still booked %+v after PrefillDone", got)
	}
	if got := f.booked(tk.Worker); got.Requests != 1 {
		t.Fatalf("decode worker booked %+v, want the request until it ends", got)
	}
	tk.PrefillDone(errors.New("late")) // only the first call counts
	if !tk.RemotePrefill() || testutil.ToFloat64(f.ms.Router.PDFallbacks) != 0 {
		t.Fatal("a second PrefillDone changed a finished leg")
	}
	f.clk.add(50 * time.Millisecond)
	tk.FirstToken(time.Time{})
	f.clk.add(time.Second)
	tk.Done(200, response.Usage{}, time.Time{})
	if len(f.pol.obs) != 1 {
		t.Fatalf("learner got %d observations, want the prefill leg's one", len(f.pol.obs))
	}
	if o := f.pol.obs[0]; o.Worker != tk.PrefillWorker || o.TTFT != 300*time.Millisecond || o.PromptTokens != 640 || o.E2E != 0 {
		t.Fatalf("prefill leg observation %+v, want p0, TTFT 300ms, 640 prompt tokens", o)
	}
	if got := f.booked(tk.Worker); got.Requests != 0 {
		t.Fatalf("decode worker booked %+v after Done", got)
	}
}

// A failed prefill falls back to local prefill on the decode worker: the prefill
// booking and its speculative entries are withdrawn, the decode worker books the whole
// uncached prompt, and the fallback is counted.
func TestPDPrefillFailureFallsBackLocal(t *testing.T) {
	f, ix := pdFixture(t)
	tk := f.pdPick(t, 640, 1)
	tk.PrefillDone(errors.New("connection refused"))
	if tk.RemotePrefill() {
		t.Fatal("RemotePrefill after a failed prefill")
	}
	if tk.PrefillWorker == "" {
		t.Fatal("the exported pick changed after the fallback")
	}
	if got := f.booked(tk.PrefillWorker); got.Requests != 0 || got.PrefillTokens != 0 {
		t.Fatalf("prefill worker still booked %+v after its failure", got)
	}
	if got := f.booked(tk.Worker); got.Requests != 1 || got.Prefilling != 1 || got.PrefillTokens != 640 {
		t.Fatalf("decode worker booked %+v, want the whole 640-token prefill", got)
	}
	if ix.Entries() != 640/16 {
		t.Fatalf("speculative entries %d, want only the decode worker's 40", ix.Entries())
	}
	if got := testutil.ToFloat64(f.ms.Router.PDFallbacks); got != 1 {
		t.Fatalf("pd_prefill_fallbacks_total = %v, want 1", got)
	}
	f.clk.add(time.Second)
	tk.FirstToken(time.Time{})
	if got := f.booked(tk.Worker); got.Decoding != 1 || got.PrefillTokens != 0 {
		t.Fatalf("decode worker booked %+v after the first token, want one decoding", got)
	}
	tk.Done(200, response.Usage{}, time.Time{})
	if len(f.pol.obs) != 0 {
		t.Fatalf("a fallen-back ticket taught %d observations; its prediction was for the pair", len(f.pol.obs))
	}
}

// Behind Envoy the sidecar runs the prefill leg unseen: the first token ends it,
// releasing the prefill worker and teaching it the TTFT less the predicted transfer.
func TestPDFirstTokenEndsUnseenPrefill(t *testing.T) {
	f, _ := pdFixture(t)
	tk := f.pdPick(t, 640, 1)
	f.clk.add(400 * time.Millisecond)
	tk.FirstToken(time.Time{})
	if got := f.booked(tk.PrefillWorker); got.Requests != 0 {
		t.Fatalf("prefill worker still booked %+v after the first token", got)
	}
	if got := f.booked(tk.Worker); got.Decoding != 1 {
		t.Fatalf("decode worker booked %+v, want one decoding", got)
	}
	if len(f.pol.obs) != 1 || f.pol.obs[0].Worker != tk.PrefillWorker || f.pol.obs[0].TTFT != 400*time.Millisecond-tk.Predicted.Transfer {
		t.Fatalf("observations %+v, want p0's leg", f.pol.obs)
	}
	tk.PrefillDone(nil) // after the first token: ignored
	if len(f.pol.obs) != 1 {
		t.Fatal("PrefillDone after the first token taught again")
	}
	tk.Done(200, response.Usage{}, time.Time{})
}

// Removing the prefill worker drops its leg's booking; the ticket lives on with its
// decode worker (the front sees the prefill fail and falls back).
func TestPDPrefillWorkerRemoved(t *testing.T) {
	f, _ := pdFixture(t)
	tk := f.pdPick(t, 640, 1)
	var keep []*workers.Worker
	for _, w := range f.reg.All() {
		if w.Name != tk.PrefillWorker {
			keep = append(keep, w)
		}
	}
	f.reg.Set(keep)
	if got := f.booked(tk.PrefillWorker); got.Requests != 0 {
		t.Fatalf("removed prefill worker still booked %+v", got)
	}
	if tk.Outcome() != "" {
		t.Fatalf("removing the prefill worker ended the ticket (%q)", tk.Outcome())
	}
	tk.PrefillDone(errors.New("gone"))
	if got := f.booked(tk.Worker); got.PrefillTokens != 640 {
		t.Fatalf("decode worker booked %+v, want the local prefill", got)
	}
	tk.Done(200, response.Usage{}, time.Time{})
	if got := f.booked(tk.Worker); got.Requests != 0 {
		t.Fatalf("decode worker booked %+v after Done", got)
	}
}

// A pool with a both-role worker among the prefill choices may serve a request
// aggregated on it; a pool without roles never pairs and counts no P/D decision.
func TestPDLocalAndAggregated(t *testing.T) {
	f := newFixture(t, 2, time.Minute)
	tk, err := f.r.Pick(context.Background(), promptOf(64, 1), PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tk.PrefillWorker != "" || tk.RemotePrefill() || testutil.CollectAndCount(f.ms.Router.PDDecisions) != 0 {
		t.Fatal("an aggregated pool paired a request")
	}
	tk.PrefillDone(errors.New("x")) // no remote prefill: ignored
	if testutil.ToFloat64(f.ms.Router.PDFallbacks) != 0 {
		t.Fatal("PrefillDone on a local ticket counted a fallback")
	}
	tk.Done(200, response.Usage{}, time.Time{})

	g, _ := pdFixture(t)
	g.reg.Set([]*workers.Worker{
		{Name: "b0", Address: "10.0.0.5:8000", Models: []string{"m"}, Role: workers.RoleBoth},
		{Name: "d0", Address: "10.0.0.1:8000", Models: []string{"m"}, Role: workers.RoleDecode},
	})
	tk2 := g.pdPick(t, 64, 1)
	if tk2.PrefillWorker != "" || tk2.Worker != "b0" {
		t.Fatalf("pick %q → %q, want b0 alone (the only prefill-capable worker decodes too)", tk2.PrefillWorker, tk2.Worker)
	}
	if got := testutil.ToFloat64(g.ms.Router.PDDecisions.WithLabelValues("local")); got != 1 {
		t.Fatalf("pd_decisions_total{local} = %v, want 1", got)
	}
}

// A pool of prefill-only workers has nothing to answer a request: 503.
func TestPDNoDecodeWorker(t *testing.T) {
	f, _ := pdFixture(t)
	f.reg.Set([]*workers.Worker{{Name: "p0", Address: "10.0.0.3:8000", Models: []string{"m"}, Role: workers.RolePrefill}})
	_, err := f.r.Pick(context.Background(), promptOf(64, 1), PickOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusServiceUnavailable {
		t.Fatalf("err %v, want a 503", err)
	}
}

// With kvroute's own policy (a scoring.PairPicker) the ticket carries the pair's
// prediction, transfer included, and the prefill leg's own prediction teaches the
// prefill worker.
func TestPDPairPickerPolicy(t *testing.T) {
	f, _ := pdFixture(t)
	pol := scoring.NewPredictor(scoring.DefaultOptions(), true)
	f.r = New(Options{Registry: f.reg, Models: []Model{{Name: "m", BlockSize: 16, KVBytesPerToken: 1 << 20}}, Policy: pol,
		TicketTTL: time.Minute, Metrics: f.ms, Now: f.clk.now})
	tk := f.pdPick(t, 8192, 1)
	if tk.PrefillWorker == "" {
		t.Fatal("an 8192-token prompt on an idle pool was not disaggregated")
	}
	// 8192 tokens × 1 MiB ÷ 25 GB/s ≈ 344 ms: the model's KV size reached the prediction
	if tk.Predicted.Transfer < 300*time.Millisecond || tk.Predicted.TTFT <= tk.Predicted.Transfer {
		t.Fatalf("pair prediction %+v, want a transfer ≥ 300 ms inside the TTFT", tk.Predicted)
	}
	f.clk.add(2 * time.Second)
	tk.PrefillDone(nil)
	if c, ok := pol.Coefficients(tk.PrefillWorker); !ok || c.Observations != 1 {
		t.Fatalf("prefill worker coefficients %+v (ok %v), want one observation", c, ok)
	}
	tk.Done(200, response.Usage{}, time.Time{})
}

// pdPredictorRouter: the P/D fixture's pool under kvroute's own policy (a
// scoring.PairPicker), with the model's KV size and the saturation rule given.
func pdPredictorRouter(t *testing.T, sat Saturation) *fixture {
	f, _ := pdFixture(t)
	f.r = New(Options{Registry: f.reg, Models: []Model{{Name: "m", BlockSize: 16, KVBytesPerToken: 1 << 20}},
		Policy: scoring.NewPredictor(scoring.DefaultOptions(), false), Saturation: sat, TicketTTL: time.Minute, Metrics: f.ms, Now: f.clk.now})
	return f
}

// The pair pick goes through the aggregated pick's admission: a request whose pair
// (prefill leg plus transfer) is predicted past its objective is refused with
// slo_miss, although the prefill leg alone would meet it.
func TestPDRefusesOnSLOMiss(t *testing.T) {
	tk := pdPredictorRouter(t, Saturation{}).pdPick(t, 8192, 1)
	leg, pair := tk.pf.predicted.TTFT, tk.Predicted.TTFT
	if tk.PrefillWorker == "" || leg <= 0 || pair <= leg {
		t.Fatalf("pair %v, leg %v: want a remote pair whose transfer adds to the leg", pair, leg)
	}
	f := pdPredictorRouter(t, Saturation{})
	_, err := f.r.Pick(context.Background(), promptOf(8192, 1), PickOptions{SLO: (leg + pair) / 2, RefuseOnSLOMiss: true})
	if e, ok := AsSLOMiss(err); !ok || e.Status != StatusTooManyRequests {
		t.Fatalf("err %v, want a 429 slo_miss (pair %v past the objective %v)", err, pair, (leg+pair)/2)
	}
	if got := f.booked("p0").Requests + f.booked("p1").Requests + f.booked("d0").Requests + f.booked("d1").Requests; got != 0 {
		t.Fatalf("a refused pair booked %d requests", got)
	}
	if tk, err := f.r.Pick(context.Background(), promptOf(8192, 2), PickOptions{SLO: 2 * pair, RefuseOnSLOMiss: true}); err != nil || tk.PrefillWorker == "" {
		t.Fatalf("pick within the objective: %v, want a remote pair", err)
	}
}

// The fair queue's wait follows the pair pick: with both prefill workers' steps
// booked full, a long prompt (remote prefill, past the local cap) waits in kvroute's
// queue although the decode workers are idle; a short one prefilled on an idle decode
// worker goes ahead.
func TestPDWaitsOnSaturatedPrefillWorker(t *testing.T) {
	f := pdPredictorRouter(t, Saturation{BatchTokens: 2048, MaxNumSeqs: 100})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if tk := f.pdPick(t, 4096, 10+i); tk.PrefillWorker == "" {
			t.Fatal("a 4096-token prompt was not disaggregated")
		}
	}
	if p0, p1 := f.booked("p0"), f.booked("p1"); p0.PrefillTokens < 2048 || p1.PrefillTokens < 2048 {
		t.Fatalf("prefill workers booked %+v / %+v, want both steps full", p0, p1)
	}
	po := PickOptions{SLO: time.Minute, Wait: true}
	if _, err := f.r.Pick(ctx, promptOf(4096, 20), po); !errors.Is(err, ErrWait) {
		t.Fatalf("long prompt onto a saturated prefill worker: err %v, want ErrWait", err)
	}
	tk, err := f.r.Pick(ctx, promptOf(256, 21), po)
	if err != nil || tk.PrefillWorker != "" {
		t.Fatalf("short prompt: err %v, ticket %+v, want a local prefill on an idle decode worker", err, tk)
	}
}

// A failed prefill leg is retried once on the other prefill worker: the failed
// worker's booking and speculative entries go, the new one books the leg, the decode
// worker is unchanged, and the retry leg teaches its own duration. A second failure
// falls back to local prefill.
func TestPDRetryPrefillOnAnotherWorker(t *testing.T) {
	f, ix := pdFixture(t)
	req := promptOf(640, 1)
	tk, err := f.r.Pick(context.Background(), req, PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failed, dw := tk.PrefillWorker, tk.Worker
	f.clk.add(100 * time.Millisecond)
	if !tk.RetryPrefill(context.Background(), req, errors.New("connection refused")) {
		t.Fatal("no retry with the other prefill worker idle")
	}
	other := map[string]string{"p0": "p1", "p1": "p0"}[failed]
	addr := map[string]string{"p0": "10.0.0.3:8000", "p1": "10.0.0.4:8000"}[other]
	if tk.PrefillWorker != other || tk.PrefillAddress != addr || tk.Worker != dw || !tk.RemotePrefill() {
		t.Fatalf("after the retry: %s@%s → %s (remote %v), want %s@%s → %s", tk.PrefillWorker, tk.PrefillAddress, tk.Worker, tk.RemotePrefill(), other, addr, dw)
	}
	if got := f.booked(failed); got.Requests != 0 || got.PrefillTokens != 0 {
		t.Fatalf("failed prefill worker still booked %+v", got)
	}
	if got := f.booked(other); got.Requests != 1 || got.Prefilling != 1 || got.PrefillTokens != 640 {
		t.Fatalf("retry worker booked %+v, want the 640-token leg", got)
	}
	if got := f.booked(dw); got.Requests != 1 || got.PrefillTokens != 0 {
		t.Fatalf("decode worker booked %+v, want the request alone", got)
	}
	if ix.Entries() != 2*640/16 {
		t.Fatalf("speculative entries %d, want the prompt's 40 blocks on the decode and the retry worker", ix.Entries())
	}
	if got := testutil.ToFloat64(f.ms.Router.PDFallbacks); got != 0 {
		t.Fatalf("a retry counted %v fallbacks", got)
	}
	f.clk.add(300 * time.Millisecond)
	tk.PrefillDone(nil)
	if len(f.pol.obs) != 1 || f.pol.obs[0].Worker != other || f.pol.obs[0].TTFT != 300*time.Millisecond {
		t.Fatalf("observations %+v, want the retry leg's 300 ms on %s", f.pol.obs, other)
	}
	tk.Done(200, response.Usage{}, time.Time{})

	// A retry that fails too falls back: one retry per request.
	tk = f.pdPick(t, 640, 2)
	if !tk.RetryPrefill(context.Background(), promptOf(640, 2), errors.New("refused")) {
		t.Fatal("no first retry")
	}
	if tk.RetryPrefill(context.Background(), promptOf(640, 2), errors.New("refused again")) || tk.RemotePrefill() {
		t.Fatal("a failed retry was retried again")
	}
	if got := f.booked(tk.Worker); got.PrefillTokens != 640 {
		t.Fatalf("decode worker booked %+v, want the local prefill", got)
	}
	if got := f.booked("p0").Requests + f.booked("p1").Requests; got != 0 {
		t.Fatalf("prefill workers hold %d bookings after the fallback", got)
	}
	if got := testutil.ToFloat64(f.ms.Router.PDFallbacks); got != 1 {
		t.Fatalf("pd_prefill_fallbacks_total = %v, want 1", got)
	}
	if ix.Entries() != 640/16+2*640/16 { // the first request's, cached; this one's decode worker's
		t.Fatalf("speculative entries %d after the fallback", ix.Entries())
	}
	tk.Abort()
}

// Without another healthy prefill worker, or once the leg is over, RetryPrefill falls
// back to local prefill (or does nothing) as PrefillDone(err) does.
func TestPDRetryPrefillFallsBack(t *testing.T) {
	f, _ := pdFixture(t)
	req := promptOf(640, 1)
	tk, err := f.r.Pick(context.Background(), req, PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"p0": "p1", "p1": "p0"}[tk.PrefillWorker]
	f.reg.SetHealthy(other, false)
	if tk.RetryPrefill(context.Background(), req, errors.New("refused")) || tk.RemotePrefill() {
		t.Fatal("retried with no other healthy prefill worker")
	}
	if got := f.booked(tk.Worker); got.PrefillTokens != 640 {
		t.Fatalf("decode worker booked %+v, want the local prefill", got)
	}
	tk.Done(200, response.Usage{}, time.Time{})
	f.reg.SetHealthy(other, true)
	tk = f.pdPick(t, 640, 3)
	tk.PrefillDone(nil)
	if tk.RetryPrefill(context.Background(), promptOf(640, 3), errors.New("late")) || !tk.RemotePrefill() {
		t.Fatal("RetryPrefill after a finished leg changed it")
	}
	tk.Abort()
}

// Under kvroute's own policy the retry is its pair pick: the other prefill worker,
// idle, is worth it for a prompt past the local-prefill cap.
func TestPDRetryPrefillPairPicker(t *testing.T) {
	f := pdPredictorRouter(t, Saturation{})
	req := promptOf(4096, 1)
	tk, err := f.r.Pick(context.Background(), req, PickOptions{})
	if err != nil || tk.PrefillWorker == "" {
		t.Fatalf("pick: %v, want a remote pair", err)
	}
	failed := tk.PrefillWorker
	if !tk.RetryPrefill(context.Background(), req, errors.New("status 500")) || tk.PrefillWorker == failed || tk.PrefillWorker == "" {
		t.Fatalf("retry on %q after %s failed, want the other prefill worker", tk.PrefillWorker, failed)
	}
	if got := f.booked(tk.PrefillWorker); got.PrefillTokens != 4096 {
		t.Fatalf("retry worker booked %+v", got)
	}
	tk.Abort()
	for _, w := range []string{"p0", "p1", "d0", "d1"} {
		if got := f.booked(w); got.Requests != 0 {
			t.Fatalf("%s booked %+v after the abort", w, got)
		}
	}
}

// With scoring.kv_transfer_learn_weight, a remote prefill whose end the front reported
// teaches the policy its transfer (PrefillDone to the first token); one whose leg the
// front never saw end (behind Envoy) or that fell back teaches nothing.
func TestPDObservedTransferTeachesBandwidth(t *testing.T) {
	f, _ := pdFixture(t)
	o := scoring.DefaultOptions()
	o.KVTransferLearnWeight = 1
	pol := scoring.NewPredictor(o, true)
	f.r = New(Options{Registry: f.reg, Models: []Model{{Name: "m", BlockSize: 16, KVBytesPerToken: 1 << 20}}, Policy: pol,
		TicketTTL: time.Minute, Metrics: f.ms, Now: f.clk.now})
	unseen := f.pdPick(t, 8192, 2)
	f.clk.add(time.Second)
	unseen.FirstToken(time.Time{})
	if got := pol.TransferBandwidth(); got != o.KVTransferBytesPerSecond {
		t.Fatalf("bandwidth %g after a transfer the front never saw begin, want the configured %g", got, o.KVTransferBytesPerSecond)
	}
	tk := f.pdPick(t, 8192, 1)
	if tk.PrefillWorker == "" {
		t.Fatal("not disaggregated")
	}
	f.clk.add(time.Second)
	tk.PrefillDone(nil)
	f.clk.add(tk.Predicted.Transfer * 4) // four times the predicted transfer
	tk.FirstToken(time.Time{})
	if got := pol.TransferBandwidth(); !(got < o.KVTransferBytesPerSecond/4) || got < o.KVTransferBytesPerSecond/8 {
		t.Fatalf("bandwidth %g after a transfer 4× slower than predicted, want below a quarter of %g, within the 1/8 floor", got, o.KVTransferBytesPerSecond)
	}
	tk.Done(200, response.Usage{}, time.Time{})
	unseen.Done(200, response.Usage{}, time.Time{})
}
