package app

import (
	"net/http"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
)

// GET /debug/admission shows durations as seconds (float), in fields named *_seconds,
// as the rest of the view does (window_seconds, window_resets_in_seconds): the
// configuration types' own JSON would print time.Duration as integer nanoseconds.

// admissionClassView is one admission.classes element.
type admissionClassView struct {
	Name          string            `json:"name"`
	Priority      int               `json:"priority"`
	TTFTObjective float64           `json:"ttft_objective_seconds"` // 0: none
	QueueLimit    int               `json:"queue_limit"`
	MaxQueueTime  float64           `json:"max_queue_time_seconds"`
	OnSLOMiss     string            `json:"on_slo_miss,omitempty"`
	SLOAttainment float64           `json:"slo_attainment,omitempty"`
	Match         config.ClassMatch `json:"match"`
}

// tokenWindowView is one of a tenant's extra token windows.
type tokenWindowView struct {
	Window float64 `json:"window_seconds"`
	Tokens int64   `json:"tokens"`
}

type limitsView struct {
	TokensPerMinute   int64             `json:"tokens_per_minute"`
	RequestsPerMinute int64             `json:"requests_per_minute"`
	MaxConcurrent     int64             `json:"max_concurrent"`
	TokenWindows      []tokenWindowView `json:"token_windows,omitempty"`
	RedisDown         string            `json:"redis_down,omitempty"`
}

// tenantView is admission.TenantState with its limits' windows in seconds (the outer
// Limits field hides the embedded one in encoding/json).
type tenantView struct {
	admission.TenantState
	Limits limitsView `json:"limits"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func (a *App) debugAdmission(w http.ResponseWriter, _ *http.Request) {
	ts := a.Admission.Snapshot()
	tenants := make([]tenantView, len(ts))
	for i, t := range ts {
		l := t.Limits
		lv := limitsView{TokensPerMinute: l.TokensPerMinute, RequestsPerMinute: l.RequestsPerMinute,
			MaxConcurrent: l.MaxConcurrent, RedisDown: l.RedisDown}
		for _, tw := range l.TokenWindows {
			lv.TokenWindows = append(lv.TokenWindows, tokenWindowView{Window: seconds(tw.Window), Tokens: tw.Tokens})
		}
		tenants[i] = tenantView{TenantState: t, Limits: lv}
	}
	classes := make([]admissionClassView, len(a.Config.Admission.Classes))
	for i, c := range a.Config.Admission.Classes {
		classes[i] = admissionClassView{Name: c.Name, Priority: c.Priority, TTFTObjective: seconds(c.TTFTObjective),
			QueueLimit: c.QueueLimit, MaxQueueTime: seconds(c.MaxQueueTime), OnSLOMiss: c.OnSLOMiss,
			SLOAttainment: c.SLOAttainment, Match: c.Match}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": tenants, "classes": classes,
		"queue_depths": a.Admission.QueueDepths()})
}
