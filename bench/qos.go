package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvroute/kvroute/config"
)

// QoSScenarios are kvbench --qos's scenarios.
var QoSScenarios = []string{"flood", "priority"}

// QoSRun is one row of a QoS comparison: one variant, one tenant.
type QoSRun struct {
	Variant, Tenant          string
	Requests, Failed         int
	TTFTp50, TTFTp90, Queued time.Duration // Queued: mean time in kvroute's queue
	// Throughput is the variant's completed requests (both tenants) per second of its
	// span (first arrival to last completion); Goodput of them those whose TTFT met the
	// objective. Equal on a variant's two rows.
	Throughput, Goodput float64
}

// RunQoS runs scenario on w in virtual time (o without QoS) and returns its rows:
//
//   - flood: tenant "flood" sends share of the requests, "light" the rest, one class
//     with a queue (objective objective, max queue time maxQueue); variants: no queue
//     (every request picked on arrival), queue FCFS, queue VTC-fair.
//   - priority: tenant "hi" (class priority 10) sends share, "lo" (priority 0) the rest,
//     same objective and max queue time; variants: queue without priorities (both 0),
//     queue with priorities; VTC-fair in both.
//
// Tenants are drawn per request from o.Seed. TTFT counts from arrival (queue included);
// failed requests (queue_timeout, queue_shed) are left out of the TTFT percentiles.
func RunQoS(scenario string, w *Workload, o VirtualOptions, share float64, objective, maxQueue time.Duration) ([]QoSRun, error) {
	heavy, light := "flood", "light"
	if scenario == "priority" {
		heavy, light = "hi", "lo"
	} else if scenario != "flood" {
		return nil, fmt.Errorf("bench: qos scenario %q: want one of %s", scenario, strings.Join(QoSScenarios, ", "))
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x9a5))
	tenant := make([]string, len(w.Items))
	for i := range tenant {
		tenant[i] = light
		if rng.Float64() < share {
			tenant[i] = heavy
		}
	}
	class := func(prio map[string]int) func(string) config.Class {
		return func(t string) config.Class {
			return config.Class{Name: t, Priority: prio[t], TTFTObjective: objective, QueueLimit: 100000, MaxQueueTime: maxQueue}
		}
	}
	type variant struct {
		name string
		qos  *VirtualQoS
	}
	var vs []variant
	tf := func(i int) string { return tenant[i] }
	switch scenario {
	case "flood":
		vs = []variant{{"no queue", nil}, {"queue FCFS", &VirtualQoS{Tenant: tf, Class: class(nil)}},
			{"queue VTC", &VirtualQoS{Tenant: tf, Class: class(nil), Fair: true}}}
	case "priority":
		vs = []variant{{"queue, equal priority", &VirtualQoS{Tenant: tf, Class: class(nil), Fair: true}},
			{"queue, hi priority 10", &VirtualQoS{Tenant: tf, Class: class(map[string]int{"hi": 10}), Fair: true}}}
	}
	var out []QoSRun
	for _, v := range vs {
		oo := o
		oo.QoS = v.qos
		rs, err := RunVirtual(w, oo)
		if err != nil {
			return nil, err
		}
		var first, last time.Duration = -1, 0
		ok, good := 0, 0
		for _, r := range rs {
			if first < 0 || r.Start < first {
				first = r.Start
			}
			last = max(last, r.Start+r.E2E)
			if r.Err == "" && r.TTFT > 0 {
				ok++
				if r.TTFT <= objective {
					good++
				}
			}
		}
		span := (last - first).Seconds()
		for _, t := range []string{heavy, light} {
			row := QoSRun{Variant: v.name, Tenant: t}
			if span > 0 {
				row.Throughput, row.Goodput = float64(ok)/span, float64(good)/span
			}
			var ttft []float64
			var q time.Duration
			for _, r := range rs {
				if tenant[r.Index] != t {
					continue
				}
				row.Requests++
				if r.Err != "" || r.TTFT <= 0 {
					row.Failed++
					continue
				}
				ttft = append(ttft, r.TTFT.Seconds())
				q += r.Queued
			}
			if n := len(ttft); n > 0 {
				row.TTFTp50 = secs(Percentile(ttft, 50))
				row.TTFTp90 = secs(Percentile(ttft, 90))
				row.Queued = q / time.Duration(n)
			}
			out = append(out, row)
		}
	}
	return out, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// QoSTable renders rows as a markdown table.
func QoSTable(rows []QoSRun) string {
	var b strings.Builder
	b.WriteString("| variant | tenant | requests | failed | TTFT p50 | TTFT p90 | mean queued | throughput | goodput |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f s | %.2f s | %.2f s | %.2f req/s | %.2f req/s |\n", r.Variant, r.Tenant, r.Requests, r.Failed,
			r.TTFTp50.Seconds(), r.TTFTp90.Seconds(), r.Queued.Seconds(), r.Throughput, r.Goodput)
	}
	return b.String()
}
