package metrics

import "github.com/prometheus/client_golang/prometheus"

// Peers holds the metrics of the exchange of bookings between kvroute replicas
// (package peers). Label "peer" is a peer replica's id, bounded by peers.max_peers;
// "reason" is a fixed class (peers.Drop*), never free text.
type Peers struct {
	// Live is the number of peer replicas whose state is current (heard from within
	// the silence timeout).
	Live prometheus.Gauge
	// StateAge is the time since the last summary received from each live peer, seconds.
	StateAge *prometheus.GaugeVec // peer
	// BytesSent and BytesReceived count summary bytes exchanged (gRPC message
	// payloads, without gRPC/HTTP/2 framing).
	BytesSent     prometheus.Counter
	BytesReceived prometheus.Counter
	// BookingsImported is the number of in-flight requests peers currently report,
	// summed over peers and workers (added to each worker's booked load).
	BookingsImported prometheus.Gauge
	// KeysImported counts block keys imported from peers as speculative index entries.
	KeysImported prometheus.Counter
	// Dropped counts received summaries not applied, by reason.
	Dropped *prometheus.CounterVec // reason
	// Expired counts peer states dropped, by reason (silent, stream_ended).
	Expired *prometheus.CounterVec // reason
	// Clamped counts worker entries of applied summaries whose claims were cut to
	// peers.max_requests_per_worker and the bounds derived from it.
	Clamped prometheus.Counter
	// InboundBytes is the size of the summaries being decoded or applied now, over
	// every connection (at most peers.max_inbound_bytes).
	InboundBytes prometheus.Gauge
}

func newPeers(reg prometheus.Registerer) *Peers {
	const sub = "peers"
	return &Peers{
		Live: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "live", Help: "Peer kvroute replicas whose booking summary is current (heard from within peers.silence_timeout)."})),
		StateAge: must(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "state_age_seconds", Help: "Time since the last booking summary from each live peer replica, seconds."}, []string{"peer"})),
		BytesSent: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "sent_bytes_total", Help: "Booking summary bytes sent to peer replicas (message payloads)."})),
		BytesReceived: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "received_bytes_total", Help: "Booking summary bytes received from peer replicas (message payloads)."})),
		BookingsImported: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "imported_bookings", Help: "In-flight requests booked by peer replicas, summed over peers and workers, added to the workers' booked load."})),
		KeysImported: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "imported_keys_total", Help: "Block keys being prefilled by peer replicas imported as speculative index entries."})),
		Dropped: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "dropped_total", Help: "Peer summaries or streams not applied, by reason (malformed, stale, self, too_many_peers, unauthenticated, unknown_peer, busy)."}, []string{"reason"})),
		Expired: must(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "expired_total", Help: "Peer states dropped with their bookings and imported entries, by reason (silent, stream_ended)."}, []string{"reason"})),
		InboundBytes: must(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: sub,
			Name: "inbound_bytes", Help: "Bytes of peer summaries being decoded or applied now, over every connection (bounded by peers.max_inbound_bytes)."})),
		Clamped: must(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub,
			Name: "clamped_total", Help: "Worker entries of peer summaries whose claimed bookings, prefill tokens, writes or times were cut to what a real replica could hold (peers.max_requests_per_worker)."})),
	}
}
