package workers

import (
	"slices"
	"strings"
	"testing"
)

// loraMetrics follows vLLM's vllm/v1/metrics/loggers.py: every label set the engine
// logged stays exported, valued at the Unix time it was last set; the newest is current.
const loraMetrics = `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="8",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7650001e+09
vllm:lora_requests_info{max_lora="8",running_lora_adapters="sql",waiting_lora_adapters="math"} 1.7650002e+09
vllm:lora_requests_info{max_lora="8",running_lora_adapters="",waiting_lora_adapters=""} 1.7650000e+09
vllm:num_requests_waiting{engine="0",model_name="base"} 1
`

func TestParseLoadLoRAInfoNewestSeries(t *testing.T) {
	l, err := ParseLoad(strings.NewReader(loraMetrics))
	if err != nil {
		t.Fatal(err)
	}
	a := l.Adapters
	if a.MaxLoRAs != 8 || !slices.Equal(a.Running, []string{"sql"}) || !slices.Equal(a.Waiting, []string{"math"}) {
		t.Fatalf("adapters = %+v, want the newest series: running [sql], waiting [math], max 8", a)
	}
	if !a.Known() || !a.Has("math") || !a.Has("sql") || a.Has("chat") {
		t.Fatalf("Known/Has wrong for %+v", a)
	}
	// The LoRA gauge alone identifies a vLLM endpoint (LoRA metrics, no queue gauges yet).
	only := "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 5\n"
	if l, err := ParseLoad(strings.NewReader(only)); err != nil || l.Adapters.MaxLoRAs != 2 || l.Adapters.Running != nil {
		t.Fatalf("empty adapter lists: %+v %v", l.Adapters, err)
	}
}

func TestParseLoadLoRAInfoMalformedIgnored(t *testing.T) {
	for _, body := range []string{
		"vllm:lora_requests_info{max_lora=\"x\",running_lora_adapters=\"a\"} 5\nvllm:num_requests_waiting 1\n",
		"vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"a\"} 5\nvllm:num_requests_waiting 1\n",
		"vllm:lora_requests_info{running_lora_adapters=\"a\"} 5\nvllm:num_requests_waiting 1\n",
	} {
		l, err := ParseLoad(strings.NewReader(body))
		if err != nil || l.Adapters.Known() || l.Waiting != 1 {
			t.Errorf("%q: a bad max_lora must drop the LoRA state only: %+v %v", body, l, err)
		}
	}
	many := strings.Repeat("a,", 1000)
	l, err := ParseLoad(strings.NewReader("vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"" + many + "\"} 5\n"))
	if err != nil || len(l.Adapters.Running) != maxAdapterNames {
		t.Fatalf("adapter list not bounded: %d names, %v", len(l.Adapters.Running), err)
	}
}
