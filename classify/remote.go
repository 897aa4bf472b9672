package classify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/metrics"
)

// Remote is a classifier served over HTTP in the shape of vLLM's pooling endpoint
// POST /classify (vllm/entrypoints/pooling/classify/protocol.py: ClassificationRequest
// {"model", "input"} → ClassificationResponse {"data": [{"index", "label", "probs",
// "num_classes"}]}), for a sequence-classification model served by `vllm serve`.
//
// Each call is bounded by Timeout and by MaxConcurrent calls in flight (a call that
// cannot start within its timeout fails); answers are cached by the xxhash64 of the
// text, so a repeated text makes no call. On failure the call fails open (an empty
// Prediction: no label, so no label rule matches) or, with FailClosed, returns the
// error wrapped in ErrRemote. Safe for concurrent use.
type Remote struct {
	opt    RemoteOptions
	sem    chan struct{}
	mu     sync.Mutex // guards cache and order; never held across a call
	cache  map[uint64]Prediction
	order  []uint64 // insertion order, for FIFO eviction
	calls  atomic.Int64
	hits   atomic.Int64
	errors atomic.Int64
	counts *prometheus.CounterVec // outcome; nil: not counted
}

// Count makes Classify count every answer in m (kvroute_classify_remote_requests_total):
// outcome ok (a call answered), cached (no call), timeout (the call, or the wait for a
// slot, ran past Timeout) or error (anything else: a status, a bad reply, no connection).
func (r *Remote) Count(m *metrics.Classify) { r.counts = m.RemoteRequests }

func (r *Remote) count(outcome string) {
	if r.counts != nil {
		r.counts.WithLabelValues(outcome).Inc()
	}
}

// RemoteOptions configure a Remote.
type RemoteOptions struct {
	// URL is the endpoint, e.g. "http://10.0.0.9:8000/classify". Required.
	URL string
	// Model is the "model" field sent (the served model name). Required.
	Model string
	// Timeout bounds one call, waiting for a slot included (default 50 ms).
	Timeout time.Duration
	// MaxConcurrent bounds the calls in flight (default 16).
	MaxConcurrent int
	// CacheEntries bounds the cache (default 10,000; negative: no cache).
	CacheEntries int
	// MaxInputBytes cuts the text sent to its first bytes (default 8 KiB).
	MaxInputBytes int
	// FailClosed makes a failed call an error instead of an empty Prediction.
	FailClosed bool
	// Client is the HTTP client (nil: a client with its own transport).
	Client *http.Client
}

// ErrRemote wraps every failure of a FailClosed Remote.
var ErrRemote = errors.New("classify: remote classifier unavailable")

// maxRemoteReply bounds the bytes read of one reply.
const maxRemoteReply = 1 << 20

// NewRemote checks opt and fills its defaults.
func NewRemote(opt RemoteOptions) (*Remote, error) {
	if opt.URL == "" || opt.Model == "" {
		return nil, errors.New("classify: a remote classifier needs a URL and a model")
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 50 * time.Millisecond
	}
	if opt.MaxConcurrent <= 0 {
		opt.MaxConcurrent = 16
	}
	if opt.CacheEntries == 0 {
		opt.CacheEntries = 10000
	}
	if opt.MaxInputBytes <= 0 {
		opt.MaxInputBytes = 8 << 10
	}
	if opt.Client == nil {
		opt.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return &Remote{opt: opt, sem: make(chan struct{}, opt.MaxConcurrent), cache: map[uint64]Prediction{}}, nil
}

// RemoteStats are a Remote's counts since it was made.
type RemoteStats struct{ Calls, CacheHits, Errors int64 }

// Stats returns the counts of calls made, cache hits and failed calls.
func (r *Remote) Stats() RemoteStats {
	return RemoteStats{Calls: r.calls.Load(), CacheHits: r.hits.Load(), Errors: r.errors.Load()}
}

type remoteRequest struct {
	Model string `json:"model"`
	Input string `json:"input"`
}

type remoteResponse struct {
	Data []struct {
		Index int       `json:"index"`
		Label string    `json:"label"`
		Probs []float64 `json:"probs"`
	} `json:"data"`
}

// Classify labels text: from the cache, else by one call. A failure is an empty
// Prediction and no error, or with FailClosed the error wrapped in ErrRemote.
func (r *Remote) Classify(ctx context.Context, text string) (Prediction, error) {
	p, err := r.lookup(ctx, text)
	if err != nil {
		if r.opt.FailClosed {
			return Prediction{}, fmt.Errorf("%w: %v", ErrRemote, err)
		}
		return Prediction{}, nil
	}
	return p, nil
}

// lookup is Classify with every failure returned (the classify stage decides per rule).
func (r *Remote) lookup(ctx context.Context, text string) (Prediction, error) {
	if len(text) > r.opt.MaxInputBytes {
		text = text[:r.opt.MaxInputBytes]
	}
	key := xxhash.Sum64String(text)
	if r.opt.CacheEntries > 0 {
		r.mu.Lock()
		p, ok := r.cache[key]
		r.mu.Unlock()
		if ok {
			r.hits.Add(1)
			r.count("cached")
			return p, nil
		}
	}
	p, err := r.call(ctx, text)
	if err != nil {
		r.errors.Add(1)
		if errors.Is(err, context.DeadlineExceeded) {
			r.count("timeout")
		} else {
			r.count("error")
		}
		return Prediction{}, err
	}
	r.count("ok")
	if r.opt.CacheEntries > 0 {
		r.mu.Lock()
		if _, ok := r.cache[key]; !ok {
			if len(r.order) >= r.opt.CacheEntries {
				delete(r.cache, r.order[0])
				r.order = r.order[1:]
			}
			r.cache[key] = p
			r.order = append(r.order, key)
		}
		r.mu.Unlock()
	}
	return p, nil
}

func (r *Remote) call(ctx context.Context, text string) (Prediction, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opt.Timeout)
	defer cancel()
	select {
	case r.sem <- struct{}{}:
		defer func() { <-r.sem }()
	case <-ctx.Done():
		return Prediction{}, fmt.Errorf("waiting for one of %d call slots: %w", r.opt.MaxConcurrent, ctx.Err())
	}
	r.calls.Add(1)
	body, _ := json.Marshal(remoteRequest{Model: r.opt.Model, Input: text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.opt.URL, bytes.NewReader(body))
	if err != nil {
		return Prediction{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.opt.Client.Do(req)
	if err != nil {
		return Prediction{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRemoteReply+1))
	if err != nil {
		return Prediction{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Prediction{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	if len(raw) > maxRemoteReply {
		return Prediction{}, fmt.Errorf("reply over %d bytes", maxRemoteReply)
	}
	var out remoteResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return Prediction{}, fmt.Errorf("reply: %w", err)
	}
	if len(out.Data) != 1 || out.Data[0].Label == "" {
		return Prediction{}, fmt.Errorf("reply has %d results, want one with a label", len(out.Data))
	}
	d := out.Data[0]
	p := Prediction{Label: d.Label, Probs: d.Probs}
	for _, q := range d.Probs {
		if q > p.Confidence {
			p.Confidence = q
		}
	}
	return p, nil
}
