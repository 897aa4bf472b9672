package main

import (
	"flag"
	"fmt"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// pdFlags are the --workload pd flags: the workload's prompt and output ranges and the
// virtual fleet's roles.
type pdFlags struct {
	prefill                    *int
	decodeRole                 *string
	promptMin, promptMax       *int
	outputMin, outputMax, docs *int
	docShare                   *float64
}

func addPDFlags(fs *flag.FlagSet) pdFlags {
	return pdFlags{
		prefill:    fs.Int("prefill-workers", 4, "pd, virtual: the first N of --workers are prefill workers, the rest --decode-role"),
		decodeRole: fs.String("decode-role", "decode", "pd, virtual: role of the other workers: decode or both"),
		promptMin:  fs.Int("prompt-min", 8192, "pd: shortest prompt, tokens"),
		promptMax:  fs.Int("prompt-max", 65536, "pd: longest prompt, tokens"),
		outputMin:  fs.Int("output-min", 64, "pd: shortest output, tokens"),
		outputMax:  fs.Int("output-max", 512, "pd: longest output, tokens"),
		docs:       fs.Int("docs", 16, "pd: shared documents (Zipf 1.1 popularity)"),
		docShare:   fs.Float64("doc-share", 0.5, "pd: share of each prompt that is a shared document, 0..1"),
	}
}

func (f pdFlags) workload(requests int, seed uint64) (*bench.Workload, error) {
	if *f.promptMin < 1 || *f.promptMax < *f.promptMin || *f.outputMin < 1 || *f.outputMax < *f.outputMin || *f.docShare < 0 || *f.docShare > 1 {
		return nil, fmt.Errorf("pd: want 1 ≤ --prompt-min ≤ --prompt-max, 1 ≤ --output-min ≤ --output-max, --doc-share in [0, 1]")
	}
	return bench.PD(bench.PDOptions{Requests: requests, PromptMin: *f.promptMin, PromptMax: *f.promptMax, OutputMin: *f.outputMin,
		OutputMax: *f.outputMax, Docs: *f.docs, DocShare: *f.docShare, Seed: seed}), nil
}

// roles returns the virtual fleet's roles for workload (nil unless pd) and sets prof's
// KV transfer link (bench's P/D rows' 25 GB/s, 2 ms).
func (f pdFlags) roles(workload string, n int, prof *sim.Profile) ([]workers.Role, error) {
	if workload != "pd" {
		return nil, nil
	}
	dr, err := workers.ParseRole(*f.decodeRole)
	if err != nil || !dr.ReceivesKV() {
		return nil, fmt.Errorf("--decode-role %q: want decode or both", *f.decodeRole)
	}
	if *f.prefill < 0 || *f.prefill >= n {
		return nil, fmt.Errorf("--prefill-workers %d: want 0..%d (at least one decode worker)", *f.prefill, n-1)
	}
	bench.PDProfile(prof)
	out := make([]workers.Role, n)
	for i := range out {
		out[i] = dr
		if i < *f.prefill {
			out[i] = workers.RolePrefill
		}
	}
	return out, nil
}
