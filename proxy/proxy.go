// Package proxy is `kvroute proxy`: a plain OpenAI-compatible reverse proxy over the
// same router core, for running without Envoy.
package proxy

import (
	"log/slog"
	"net/http"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
)

// Options configures a Handler.
type Options struct {
	Router  *router.Router
	Config  config.ExtProc
	Metrics *metrics.Set
	Logger  *slog.Logger
}

// New returns the proxy handler. (placeholder: the router-core issue replaces it)
func New(opt Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not yet", http.StatusNotImplemented)
	})
}
