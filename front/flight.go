package front

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tracing"
)

// Settler settles a request's admission grant: *admission.Grant (nil-safe). counted is
// the generated tokens counted from the response stream, -1 when they were not counted.
type Settler interface {
	Settle(res response.Result, counted int)
}

// Flight is the end of one routed request, the same for both fronts: the ticket is
// completed or aborted once, the admission grant settled with what the ticket ended
// with, an abort counted by its reason, and the trace span told. The first of Complete
// and Abort wins; later calls return the outcome it recorded and do nothing else.
//
// A Flight is used from one goroutine (the ext_proc stream's, or the proxied request's
// handler and its ReverseProxy hooks); the Ticket itself is safe for any goroutine.
type Flight struct {
	Ticket *router.Ticket
	Grant  Settler                // nil: no admission
	Route  *tracing.Route         // nil: not traced
	Aborts *prometheus.CounterVec // label: reason; nil: not counted

	ended   bool
	outcome response.Outcome
}

// Ended reports whether Complete or Abort has run.
func (f *Flight) Ended() bool { return f.ended }

// Outcome is what the ticket ended with; "" before Complete or Abort.
func (f *Flight) Outcome() response.Outcome { return f.outcome }

// Complete ends the request with the response's result (router.Ticket.Complete decides
// the outcome from res), settles the grant with it and counted, and records the status
// and usage on the span. It returns the outcome.
func (f *Flight) Complete(res response.Result, counted int) response.Outcome {
	if f.ended {
		return f.outcome
	}
	f.ended = true
	f.outcome = f.Ticket.Complete(res, time.Time{})
	res.Outcome = f.outcome
	f.settle(res, counted)
	f.Route.Completed(res.Status, res.Usage)
	return f.outcome
}

// Abort ends the request before its response completed, with outcome o (the ticket
// keeps an earlier one: router.Ticket.AbortWith), settles the grant, counts reason on
// Aborts and marks the span failed. It returns the outcome.
func (f *Flight) Abort(reason string, o response.Outcome, counted int) response.Outcome {
	if f.ended {
		return f.outcome
	}
	f.ended = true
	f.outcome = f.Ticket.AbortWith(o)
	f.settle(response.Result{Outcome: f.outcome}, counted)
	if f.Aborts != nil {
		f.Aborts.WithLabelValues(reason).Inc()
	}
	f.Route.Fail("aborted: " + reason)
	return f.outcome
}

func (f *Flight) settle(res response.Result, counted int) {
	if f.Grant != nil {
		f.Grant.Settle(res, counted)
	}
}
