package metrics

import "github.com/prometheus/client_golang/prometheus"

// Index holds the KV prefix index and KV event subscription metrics. Label "worker" is a
// configured worker name; per-worker series are deleted when the worker is removed
// (DeleteWorker).
type Index struct {
	Events        *prometheus.CounterVec   // worker, type: events applied (BlockStored, BlockRemoved, AllBlocksCleared, Unknown, skipped)
	Blocks        *prometheus.CounterVec   // worker, op: stored, removed — blocks applied
	Batches       *prometheus.CounterVec   // worker: batches (ZMQ messages) applied
	DecodeErrors  *prometheus.CounterVec   // worker: payloads that did not decode (dropped whole)
	Anomalies     *prometheus.CounterVec   // worker, kind: unknown_parent, unknown_removed, block_size_mismatch, bad_event
	Gaps          *prometheus.CounterVec   // worker: sequence gaps detected
	Replays       *prometheus.CounterVec   // worker, result: ok, partial, failed
	Restarts      *prometheus.CounterVec   // worker: publisher restarts detected (sequence went backwards)
	QueueDrops    *prometheus.CounterVec   // worker: messages dropped because the worker's queue was full
	Reconnects    *prometheus.CounterVec   // worker: subscription sockets re-created after an error or a closed publisher connection
	Mode          *prometheus.GaugeVec     // worker, mode: 1 for the worker's current mode (exact, approximate, none), 0 otherwise
	WorkerEntries *prometheus.GaugeVec     // worker: (block, worker) entries held for the worker, confirmed + speculative
	LagSeconds    *prometheus.HistogramVec // worker: now − batch timestamp when a batch is applied
	Entries       prometheus.Gauge         // all (block, worker) entries
	Keys          prometheus.Gauge         // distinct block keys
	Bytes         prometheus.Gauge         // estimated index memory
	Evictions     *prometheus.CounterVec   // reason: memory, capacity, expired

	// Disconnects (worker; "" for the bind-mode socket): publisher connections ZMQ
	// closed — a publisher gone or restarted, or a message part over
	// index.max_message_bytes (dropped unread).
	Disconnects *prometheus.CounterVec
	// DroppedMessages (reason: unmatched_topic, ambiguous_host, malformed_frame): bind-mode messages
	// attributed to no worker.
	DroppedMessages *prometheus.CounterVec
	// ReplayBackoffs (worker): gaps not replayed because the worker's replay endpoint
	// failed recently and is in backoff.
	ReplayBackoffs *prometheus.CounterVec
	// ReplaysPending (worker): data-parallel ranks of the worker with a replay in flight
	// (asynchronous: live frames meanwhile wait in the reorder buffer).
	ReplaysPending *prometheus.GaugeVec
	// ReplayBufferedFrames and ReplayBufferedBytes (worker): live frames (and their
	// payload bytes) held in the reorder buffer behind pending replays.
	ReplayBufferedFrames *prometheus.GaugeVec
	ReplayBufferedBytes  *prometheus.GaugeVec
	// ReplayBufferOverflows (worker): pending replays abandoned because the reorder
	// buffer reached index.replay_buffer_frames or _bytes; the buffered frames are
	// applied at once and the worker goes approximate.
	ReplayBufferOverflows *prometheus.CounterVec
	// ReplayBufferDiscarded (worker): buffered live frames discarded because their
	// publisher restarted while the replay was pending (its entries were reset).
	ReplayBufferDiscarded *prometheus.CounterVec
}

func newIndex(reg prometheus.Registerer) *Index {
	const sub = "index"
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help}, labels))
	}
	g := func(name, help string) prometheus.Gauge {
		return must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help}))
	}
	return &Index{
		Events:       cv("events_total", "KV events applied per worker, by type (skipped: a KV cache group not indexed).", "worker", "type"),
		Blocks:       cv("blocks_total", "Blocks applied per worker, by op (stored, removed).", "worker", "op"),
		Batches:      cv("batches_total", "KV event batches (ZMQ messages) applied per worker.", "worker"),
		DecodeErrors: cv("decode_errors_total", "KV event payloads that did not decode and were dropped whole, per worker.", "worker"),
		Anomalies: cv("anomalies_total", "Events that could not be applied exactly, per worker and kind (unknown_parent, unknown_removed, block_size_mismatch, bad_event: fields disagree, event dropped alone).",
			"worker", "kind"),
		Gaps:       cv("sequence_gaps_total", "Sequence gaps detected in a worker's KV event stream.", "worker"),
		Replays:    cv("replays_total", "Replay requests per worker by result (ok, partial, failed; abandoned: reorder buffer overflow or publisher restart while pending).", "worker", "result"),
		Restarts:   cv("restarts_total", "Publisher restarts detected (sequence number went backwards), per worker.", "worker"),
		QueueDrops: cv("queue_drops_total", "KV event messages dropped because the worker's queue was full (a resync follows).", "worker"),
		Reconnects: cv("reconnects_total", "KV event sockets re-created after an error or a closed publisher connection, per worker.", "worker"),
		Mode: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: "mode",
			Help: "1 for the worker's current index mode (exact: events in sync; approximate: speculative, out of sync, or its stored events failing to apply; none), 0 otherwise."}, []string{"worker", "mode"})),
		WorkerEntries: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: "worker_entries",
			Help: "Blocks the index holds for a worker (confirmed engine entries + speculative)."}, []string{"worker"})),
		LagSeconds: must(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub, Name: "event_lag_seconds",
			Help: "Time from a batch's publisher timestamp to its application (includes clock skew).", Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14)}, []string{"worker"})),
		Entries:   g("entries", "(block, worker) entries in the index."),
		Keys:      g("keys", "Distinct block keys in the index."),
		Bytes:     g("bytes", "Estimated memory held by the index (measured bytes per structure × counts)."),
		Evictions: cv("evictions_total", "Entries evicted by reason (memory: cap reached; capacity: approximate worker over its block capacity; expired: speculative TTL).", "reason"),

		Disconnects:     cv("disconnects_total", "KV event publisher connections closed by ZMQ (publisher gone or restarted, or a message part over index.max_message_bytes, dropped unread), per worker (\"\": the bind-mode socket).", "worker"),
		DroppedMessages: cv("dropped_messages_total", "Bind-mode KV event messages attributed to no worker, by reason (unmatched_topic, ambiguous_host: a bare host several workers share, malformed_frame).", "reason"),
		ReplayBackoffs:  cv("replay_backoffs_total", "Sequence gaps not replayed because the worker's replay endpoint failed recently (exponential backoff); the worker goes approximate.", "worker"),
		ReplaysPending: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: "replays_pending",
			Help: "Data-parallel ranks of a worker with a replay in flight (live frames meanwhile wait in the reorder buffer)."}, []string{"worker"})),
		ReplayBufferedFrames: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: "replay_buffered_frames",
			Help: "Live KV event frames held in a worker's reorder buffer behind pending replays."}, []string{"worker"})),
		ReplayBufferedBytes: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub, Name: "replay_buffered_bytes",
			Help: "Payload bytes of the live frames held in a worker's reorder buffer behind pending replays."}, []string{"worker"})),
		ReplayBufferOverflows: cv("replay_buffer_overflows_total", "Pending replays abandoned because the worker's reorder buffer reached index.replay_buffer_frames or index.replay_buffer_bytes (buffered frames applied at once; the worker goes approximate).", "worker"),
		ReplayBufferDiscarded: cv("replay_buffer_discarded_total", "Buffered live frames discarded because their publisher restarted while a replay was pending (its entries were reset).", "worker"),
	}
}

// DeleteWorker removes every per-worker series of worker.
func (m *Index) DeleteWorker(worker string) {
	for _, v := range []*prometheus.CounterVec{m.Events, m.Blocks, m.Batches, m.DecodeErrors, m.Anomalies, m.Gaps,
		m.Replays, m.Restarts, m.QueueDrops, m.Reconnects, m.Disconnects, m.ReplayBackoffs,
		m.ReplayBufferOverflows, m.ReplayBufferDiscarded} {
		v.DeletePartialMatch(prometheus.Labels{"worker": worker})
	}
	for _, v := range []*prometheus.GaugeVec{m.ReplaysPending, m.ReplayBufferedFrames, m.ReplayBufferedBytes} {
		v.DeleteLabelValues(worker)
	}
	m.Mode.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.WorkerEntries.DeleteLabelValues(worker)
	m.LagSeconds.DeleteLabelValues(worker)
}
