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
	cls           *config.Class
}

// virtualRuns lists the runs of a virtual comparison: each policy in names as it is,
// then, with mode "refuse", kvroute behind SLO admission ("kvroute+refuse": class
// objective slo, on_slo_miss refuse), and with flowControl the llm-d-style flow-control
// baseline ("llmd_flow_control": llmd_prefix_affinity behind kvroute's queue, which
// holds a request while the worker it would get is saturated, for at most slo — its
// TTL — then refuses it; no prediction is involved).
func virtualRuns(names []string, mode string, flowControl bool, slo time.Duration) ([]virtualRun, error) {
	var runs []virtualRun
	for _, p := range names {
		runs = append(runs, virtualRun{label: p, policy: p})
	}
	switch mode {
	case "":
	case config.SLOMissRefuse:
		runs = append(runs, virtualRun{label: "kvroute+refuse", policy: scoring.PolicyKVRoute,
			cls: &config.Class{Name: "slo", TTFTObjective: slo, OnSLOMiss: config.SLOMissRefuse}})
	default:
		return nil, fmt.Errorf("--admission %q: want refuse", mode)
	}
	if flowControl {
		runs = append(runs, virtualRun{label: "llmd_flow_control", policy: scoring.PolicyLLMD,
			cls: &config.Class{Name: "flow", TTFTObjective: slo, QueueLimit: 1 << 20, MaxQueueTime: slo}})
	}
	return runs, nil
}
