package main

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/scoring"
)

// virtualRun is one policy run of a virtual comparison: the report's label, the
// scoring policy and, for admission runs, the class every request belongs to.
type virtualRun struct {
	label, policy string
	cls, high     *config.Class
}

// virtualRuns lists the runs of a virtual comparison: each policy in names as it is,
// then, with mode "refuse", kvroute behind SLO admission ("kvroute+refuse": class
// objective slo, on_slo_miss refuse), and with flowControl the llm-d-style flow-control
// baseline ("llmd_flow_control": llmd_prefix_affinity behind kvroute's queue, which
// holds a request while the worker it would get is saturated, for at most slo — its
// TTL — then refuses it; no prediction is involved).
//
// With highShare > 0 (mode refuse) that share of the kvroute+refuse run's requests is
// in a class "high" of priority 10 asking attainment highAttainment, and a run
// "kvroute+refuse,flat" gives the same split no priority (both 0).
func virtualRuns(names []string, mode string, flowControl bool, slo time.Duration, highShare, highAttainment float64) ([]virtualRun, error) {
	var runs []virtualRun
	for _, p := range names {
		runs = append(runs, virtualRun{label: p, policy: p})
	}
	switch mode {
	case "":
	case config.SLOMissRefuse:
		low := &config.Class{Name: "slo", TTFTObjective: slo, OnSLOMiss: config.SLOMissRefuse}
		run := virtualRun{label: "kvroute+refuse", policy: scoring.PolicyKVRoute, cls: low}
		if highShare > 0 {
			high := &config.Class{Name: "high", Priority: 10, TTFTObjective: slo, OnSLOMiss: config.SLOMissRefuse, SLOAttainment: highAttainment}
			flat := *high
			flat.Priority = 0
			run.high = high
			runs = append(runs, virtualRun{label: "kvroute+refuse,flat", policy: scoring.PolicyKVRoute, cls: low, high: &flat})
		}
		runs = append(runs, run)
	default:
		return nil, fmt.Errorf("--admission %q: want refuse", mode)
	}
	if flowControl {
		runs = append(runs, virtualRun{label: "llmd_flow_control", policy: scoring.PolicyLLMD,
			cls: &config.Class{Name: "flow", TTFTObjective: slo, QueueLimit: 1 << 20, MaxQueueTime: slo}})
	}
	return runs, nil
}
