package metrics

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Inventory builds a complete Set on a fresh registry, gives every vector one child
// (each label set to "x") so that it appears in a gather, and returns the gathered
// families: every metric kvroute can export, with its type, help and label names. Tests
// (naming conventions, the Grafana dashboards) check against it; it is not for serving.
func Inventory() ([]*dto.MetricFamily, error) {
	reg := prometheus.NewPedanticRegistry()
	rec := &recorder{Registry: reg}
	New(rec)
	for _, c := range rec.collectors {
		m := reflect.ValueOf(c).MethodByName("WithLabelValues")
		if !m.IsValid() {
			continue
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			n := len(variableLabels(d))
			args := make([]reflect.Value, n)
			for i := range args {
				args[i] = reflect.ValueOf("x")
			}
			if m.Type().NumIn() != 0 && !m.Type().IsVariadic() && m.Type().NumIn() != n {
				return nil, fmt.Errorf("metrics: %s: WithLabelValues takes %d values, desc has %d labels", d, m.Type().NumIn(), n)
			}
			m.Call(args)
		}
	}
	return reg.Gather()
}

// recorder remembers every collector registered through it.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descLabels matches the variable labels in prometheus.Desc.String():
// `Desc{fqName: "…", help: "…", constLabels: {…}, variableLabels: {a,b}}`.
var descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)

func variableLabels(d *prometheus.Desc) []string {
	m := descLabels.FindStringSubmatch(d.String())
	if m == nil || m[1] == "" {
		return nil
	}
	return strings.Split(m[1], ",")
}
