package workers

import (
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// metricLoRA is vLLM's LoRA info gauge (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger): one series per distinct label set
// {running_lora_adapters, waiting_lora_adapters, max_lora}, each set to the wall time
// (Unix seconds, set_to_current_time) when the engine last logged that state. The
// adapter labels are comma-joined adapter names ("" for none); max_lora is the
// engine's --max-loras (adapters one batch may hold at once). Old label sets stay
// exported, so the current state is the series with the largest value.
const metricLoRA = "vllm:lora_requests_info"

// maxAdapterNames bounds the adapters kept per list from one scrape (a worker with
// thousands of adapters named in one label is not believed past this).
const maxAdapterNames = 256

// Adapters is a worker's LoRA state from its last scrape of vllm:lora_requests_info.
// The zero value means the worker exports no LoRA state (LoRA disabled, or not vLLM).
type Adapters struct {
	Running []string `json:"running,omitempty"` // adapters of running requests (running_lora_adapters)
	Waiting []string `json:"waiting,omitempty"` // adapters of waiting requests (waiting_lora_adapters)
	// MaxLoRAs is the engine's max_lora label (--max-loras): how many distinct adapters
	// one engine step may hold; 0 when not exported.
	MaxLoRAs int `json:"max_loras,omitempty"`
}

// Known reports whether the worker exported its LoRA state.
func (a Adapters) Known() bool { return a.MaxLoRAs > 0 }

// Has reports whether adapter is among the running or waiting adapters.
func (a Adapters) Has(adapter string) bool {
	return slices.Contains(a.Running, adapter) || slices.Contains(a.Waiting, adapter)
}

// parseAdapters reads the newest series of vllm:lora_requests_info; ok is false when
// there is none or its max_lora label is not a positive integer.
func parseAdapters(f *dto.MetricFamily) (a Adapters, ok bool) {
	var newest *dto.Metric
	for _, m := range f.GetMetric() {
		if newest == nil || value(m) > value(newest) {
			newest = m
		}
	}
	if newest == nil {
		return Adapters{}, false
	}
	for _, lp := range newest.GetLabel() {
		switch lp.GetName() {
		case "running_lora_adapters":
			a.Running = splitAdapters(lp.GetValue())
		case "waiting_lora_adapters":
			a.Waiting = splitAdapters(lp.GetValue())
		case "max_lora":
			n, err := strconv.Atoi(strings.TrimSpace(lp.GetValue()))
			if err != nil || n <= 0 {
				return Adapters{}, false
			}
			a.MaxLoRAs = n
		}
	}
	return a, a.MaxLoRAs > 0
}

// splitAdapters splits a comma-joined adapter list, dropping empty names and
// keeping at most maxAdapterNames.
func splitAdapters(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" && len(out) < maxAdapterNames {
			out = append(out, n)
		}
	}
	return out
}
