package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The worker's side of vLLM's NixlConnector P/D (pd.go has the engine's): the
// kv_transfer_params a request carries and a prefill response returns, with the field
// names and values of vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py
// (NIXL connector version 2: remote_request_id included).
//
// NIXL itself (the handshake on VLLM_NIXL_SIDE_CHANNEL_PORT, the RDMA read, the
// notification that frees the prefill's blocks) is stood in for by one HTTP call: the
// decode worker POSTs PathKVRead to remote_host:remote_port, which the prefill worker
// advertises as its own HTTP address (WorkerOptions.SideChannel). The prefill worker
// answers whether it holds the blocks and frees them; the decode engine then charges
// Profile.TransferTime for the blocks it lacks. The blocks are freed when the read
// starts rather than when it ends.

// KV roles (vLLM kv_transfer_config kv_role).
const (
	KVRoleProducer = "kv_producer" // prefill worker: honours do_remote_decode
	KVRoleConsumer = "kv_consumer" // decode worker: honours do_remote_prefill
	KVRoleBoth     = "kv_both"     // both
)

// PathKVRead is the prefill worker's stand-in for NIXL's read and notification: POST
// {"remote_request_id", "remote_engine_id", "remote_block_ids"} → 200 {"blocks": n}
// and the blocks are freed, or 404 when it holds no such blocks (never held, read
// already, expired).
const PathKVRead = "/sim/nixl/read"

// DefaultKVHoldTimeout is how long a finished prefill holds its blocks for a decode
// engine that never reads them (vLLM VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
const DefaultKVHoldTimeout = 480 * time.Second

// kvParams is kv_transfer_params as vLLM's toy proxy, llm-d's routing sidecar and the
// prefill response write it (null fields decode as zero).
type kvParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
}

// kvResult is the kv_transfer_params a prefill response carries, in the order
// NixlConnectorScheduler.request_finished builds them.
type kvResult struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// pdState is a worker's P/D state: the finished prefills holding blocks, by
// remote_request_id.
type pdState struct {
	mu    sync.Mutex // guards holds
	holds map[string]*heldKV
	host  string
	port  int
	// vLLM's NIXL connector metrics (nixl_connector.py NixlPromMetrics).
	failed, expired prometheus.Counter
}

type heldKV struct {
	req    *Request
	blocks []int32
	timer  *time.Timer
}

func (w *Worker) initPD() error {
	switch w.opt.KVRole {
	case "", KVRoleProducer, KVRoleConsumer, KVRoleBoth:
	default:
		return fmt.Errorf("sim: kv role %q: want %s, %s or %s", w.opt.KVRole, KVRoleProducer, KVRoleConsumer, KVRoleBoth)
	}
	if w.opt.KVHoldTimeout <= 0 {
		w.opt.KVHoldTimeout = DefaultKVHoldTimeout
	}
	if w.opt.HTTPClient == nil {
		w.opt.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if w.opt.EngineID == "" {
		w.opt.EngineID = fmt.Sprintf("%08x-sim", w.Runner.eng.seed>>32)
	}
	pd := &pdState{holds: map[string]*heldKV{}, host: "localhost", port: 5600} // vLLM's side-channel defaults
	if w.opt.SideChannel != "" {
		h, p, err := net.SplitHostPort(w.opt.SideChannel)
		if err != nil {
			return fmt.Errorf("sim: side channel %q: %w", w.opt.SideChannel, err)
		}
		if pd.port, err = strconv.Atoi(p); err != nil {
			return fmt.Errorf("sim: side channel %q: port: %w", w.opt.SideChannel, err)
		}
		pd.host = h
	}
	l := prometheus.Labels{"model_name": w.opt.Model, "engine": "0"}
	pd.failed = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:nixl_num_failed_transfers_total",
		Help: "Number of failed NIXL KV Cache transfers.", ConstLabels: l})
	pd.expired = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:nixl_num_kv_expired_reqs_total",
		Help: "Number of requests that had their KV expire.", ConstLabels: l})
	w.Registry.MustRegister(pd.failed, pd.expired)
	w.pd = pd
	if w.opt.KVRole == KVRoleProducer || w.opt.KVRole == KVRoleBoth {
		w.mux.HandleFunc("POST "+PathKVRead, w.handleKVRead)
	}
	return nil
}

// applyKVParams reads a request's kv_transfer_params into req: do_remote_decode on a
// producer makes it hold its blocks when done; do_remote_prefill on a consumer reads
// the prompt's KV from the prefill worker named by the remote fields. A read that
// fails (invalid fields, prefill worker unreachable or not holding the blocks) leaves
// a local prefill, counted in vllm:nixl_num_failed_transfers_total. Without a KV role
// the params are ignored, as vLLM without a KV connector does. The error is for a
// malformed value (HTTP 400).
func (w *Worker) applyKVParams(ctx context.Context, raw json.RawMessage, req *Request) error {
	if w.opt.KVRole == "" || len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var p kvParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("kv_transfer_params: %w", err)
	}
	producer := w.opt.KVRole != KVRoleConsumer
	consumer := w.opt.KVRole != KVRoleProducer
	switch {
	case p.DoRemotePrefill && consumer:
		if n, err := w.readRemoteKV(ctx, p); err != nil {
			w.pd.failed.Inc()
		} else {
			req.RemoteBlocks = n
		}
	case p.DoRemoteDecode && producer:
		req.RemoteDecode = true
	}
	return nil
}

var errKVParams = errors.New("kv_transfer_params: do_remote_prefill needs remote_block_ids, remote_engine_id, remote_request_id, remote_host and remote_port")

// readRemoteKV asks the prefill worker for the blocks p names and returns how many it
// handed over.
func (w *Worker) readRemoteKV(ctx context.Context, p kvParams) (int, error) {
	if len(p.RemoteBlockIDs) == 0 || p.RemoteEngineID == "" || p.RemoteRequestID == "" || p.RemoteHost == "" || p.RemotePort <= 0 {
		return 0, errKVParams
	}
	body, _ := json.Marshal(map[string]any{"remote_request_id": p.RemoteRequestID, "remote_engine_id": p.RemoteEngineID,
		"remote_block_ids": p.RemoteBlockIDs})
	url := "http://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort)) + PathKVRead
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := w.opt.HTTPClient.Do(hr)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Blocks int `json:"blocks"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&out)
	if resp.StatusCode != http.StatusOK || err != nil || out.Blocks != len(p.RemoteBlockIDs) {
		return 0, fmt.Errorf("remote KV read from %s: status %d", p.RemoteHost, resp.StatusCode)
	}
	return out.Blocks, nil
}

// handleKVRead serves PathKVRead on a prefill worker.
func (w *Worker) handleKVRead(rw http.ResponseWriter, r *http.Request) {
	var q struct {
		RequestID string  `json:"remote_request_id"`
		EngineID  string  `json:"remote_engine_id"`
		BlockIDs  []int64 `json:"remote_block_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&q); err != nil {
		apiError(rw, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	w.pd.mu.Lock()
	h, ok := w.pd.holds[q.RequestID]
	match := ok && q.EngineID == w.opt.EngineID && slices.Equal(q.BlockIDs, int64s(h.blocks))
	if match {
		delete(w.pd.holds, q.RequestID)
		h.timer.Stop()
	}
	w.pd.mu.Unlock()
	if !match {
		apiError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("no KV blocks held for request %q of engine %q", q.RequestID, q.EngineID))
		return
	}
	w.Runner.Release(h.req)
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"blocks": len(h.blocks)})
}

// holdKV registers a finished prefill's held blocks under its request id and returns
// the kv_transfer_params its response carries. Unread, they are freed after
// KVHoldTimeout (counted in vllm:nixl_num_kv_expired_reqs_total).
func (w *Worker) holdKV(id string, req *Request, blocks []int32) *kvResult {
	h := &heldKV{req: req, blocks: blocks}
	w.pd.mu.Lock()
	w.pd.holds[id] = h
	h.timer = time.AfterFunc(w.opt.KVHoldTimeout, func() {
		w.pd.mu.Lock()
		live := w.pd.holds[id] == h
		delete(w.pd.holds, id)
		w.pd.mu.Unlock()
		if live && w.Runner.Release(req) {
			w.pd.expired.Inc()
		}
	})
	w.pd.mu.Unlock()
	return &kvResult{DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: w.opt.EngineID, RemoteRequestID: id,
		RemoteHost: w.pd.host, RemotePort: w.pd.port, TPSize: 1}
}

func int64s(ids []int32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}
