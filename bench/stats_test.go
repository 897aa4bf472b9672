package bench

import (
	"bytes"
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {50, 3}, {25, 2}, {90, 4.6}, {100, 5}} {
		if got := Percentile(append([]float64(nil), xs...), c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("p%.0f = %v, want %v", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("empty percentile is not NaN")
	}
}

func TestSummarize(t *testing.T) {
	s := time.Second
	rs := []Result{
		{Start: 0, TTFT: 1 * s, E2E: 2 * s, PromptTokens: 100, CachedTokens: 50, Worker: "a", Predicted: 2 * s},
		{Start: 10 * s, TTFT: 9 * s, E2E: 20 * s, PromptTokens: 100, CachedTokens: 0, Worker: "a", Predicted: 9 * s},
		{Start: 20 * s, TTFT: 2 * s, E2E: 40 * s, PromptTokens: 200, CachedTokens: 150, Worker: "b"},
		{Start: 30 * s, E2E: s, Err: "HTTP 500"},
	}
	sum := Summarize("p", "x", rs, 8*s, 0.9, []string{"a", "b", "c"})
	if sum.Errors != 1 || sum.Requests != 4 {
		t.Errorf("errors %d requests %d", sum.Errors, sum.Requests)
	}
	if sum.TTFTp50 != 2 || sum.DurationS != 60 || sum.Goodput != 2 || sum.SLOMet != 0.5 {
		t.Errorf("p50 %v duration %v goodput %v met %v", sum.TTFTp50, sum.DurationS, sum.Goodput, sum.SLOMet)
	}
	if sum.HitRatio != 0.5 || sum.HitBound != 0.9 {
		t.Errorf("hit %v", sum.HitRatio)
	}
	if sum.PerWorker["a"] != 2 || sum.PerWorker["c"] != 0 || math.Abs(sum.LoadCV-math.Sqrt(2.0/3)/1) > 1e-9 {
		t.Errorf("per worker %v cv %v", sum.PerWorker, sum.LoadCV)
	}
	if sum.PredMAE != 0.5 {
		t.Errorf("prediction MAE %v", sum.PredMAE)
	}
	rep := &Report{Summaries: []Summary{sum, func() Summary { k := sum; k.Policy = "kvroute"; return k }()}}
	var buf bytes.Buffer
	rep.WriteTable(&buf)
	if !strings.Contains(buf.String(), "kvroute vs baselines at x") || !strings.Contains(buf.String(), "TTFT p50") {
		t.Errorf("table:\n%s", buf.String())
	}
	// SVGs are well-formed XML.
	for _, f := range []func(*bytes.Buffer){
		func(b *bytes.Buffer) { WriteCDF(b, "cdf <&>", rep.Summaries) },
		func(b *bytes.Buffer) {
			WriteTTFTvsLoad(b, "load", []LoadPoint{{1, sum}, {2, sum}})
		},
	} {
		var b bytes.Buffer
		f(&b)
		d := xml.NewDecoder(&b)
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("svg: %v", err)
				}
				break
			}
		}
	}
}

func TestParseTarget(t *testing.T) {
	tg, err := ParseTarget("rr=round_robin:http://a:1,http://b:2/")
	if err != nil || tg.Route != "round_robin" || len(tg.URLs) != 2 || tg.URLs[1] != "http://b:2" {
		t.Fatalf("%+v %v", tg, err)
	}
	for _, bad := range []string{"x", "=http://a", "x=ftp://a", "x=http://a,http://b"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
