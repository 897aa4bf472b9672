// Package peers lets several kvroute replicas run active-active without a shared
// store: each replica streams a compact summary of its own in-flight bookings to every
// peer, and adds the peers' bookings to what its router sees.
//
// # What is shared, what is not
//
// The KV index needs no sharing: every replica subscribes to every worker's KV event
// publisher (ZMQ PUB fans out to any number of SUB sockets; connect mode), applies the
// same sequenced events and converges on the same index, with replay and restart
// detection per replica. Bind mode (index.bind_endpoint) cannot fan out, since a vLLM
// publisher connects to one endpoint; config rejects it when peers are configured.
//
// What one replica cannot see is the others' bookings: requests they routed that the
// workers' scraped load does not show yet, and the prefixes those requests are
// prefilling. Without them, a burst of requests for one new prefix spread over N
// replicas starts up to N cold prefills of it on N workers. The summary carries, per
// worker with open requests: booked requests, prefilling requests, booked prefill
// tokens, the start of the oldest prefilling request, decoding requests, and the block
// keys being prefilled (the speculative index entries this replica's prefilling
// requests created there; at most MaxKeysPerWorker per worker), and (wire version 2)
// the sender's decayed cache writes to the worker (its policy's scoring.WriteSharer)
// and the times its requests there got their first token or finished in the last
// router.LeftWindow (at most router.MaxLeftEvents each). A receiver adds the
// bookings to each worker's scoring.Booked (router.SetPeerBookings, summed over peers),
// books the keys as speculative index entries (kvindex Book, withdrawn when the
// peer goes away), and hands the writes and times to the router, which gives each
// pick the peers' writes decayed to its time (Candidate.PeerWrites) and their
// requests that left the worker after its scrape (Candidate.PeerLeft): a scrape
// still counts those waiting or running. The policy counts both with
// scoring.peer_state only (off by default; BENCHMARKS.md "Replicas"). The scraped vLLM load stays the ground truth that corrects drift:
// imported bookings only add to booked load, and a summary replaces the previous one
// from the same peer (no deltas to lose).
//
// # Transport and failure detection: gRPC streams, not memberlist
//
// Each replica dials every target (a static list, or a DNS name / Kubernetes
// EndpointSlices through the workers discovery sources filling a registry of peers)
// and holds one client-streaming gRPC call open to it, on which it sends its summary
// whenever its bookings change, coalesced to at most one per Interval (25 ms) on the
// leading edge: the first change after a quiet Interval goes out at once (the router's
// ChangeSignal wakes the sender), later ones when the Interval since the last summary
// has passed; and at least every SilenceTimeout/3 while nothing changes. A fixed tick
// instead delays every change by up to an Interval, and in that window another replica
// routes the next request for the same new prefix without seeing it (a duplicate cold
// prefill; BENCHMARKS.md "Replicas" measures what that cost under cache pressure). Every summary is complete and
// carries the sender's id, a random incarnation (per process start) and a sequence
// number; the receiver drops a summary older than the last one it applied.
//
// A peer's state is dropped, its bookings and imported entries with it, when its
// stream ends (a replica that exits or is killed closes its TCP connections, which
// ends the stream at once) or when nothing arrived from it for SilenceTimeout (a
// partition, a hung process; gRPC keepalive also closes a dead connection).
//
// hashicorp/memberlist was the alternative (SWIM gossip with failure detection, as
// Consul, Loki and Mimir use). It was not chosen because: kvroute already runs gRPC
// and its dependencies; the state is small and every replica needs every peer's state
// (a full mesh of N−1 streams, N ≤ a dozen replicas), so gossip's dissemination buys
// nothing and adds its propagation delay (gossip intervals, ~200 ms) to the exact
// window where duplicate prefills happen (a burst's first tens of milliseconds);
// memberlist's user-state path (push/pull, broadcasts ≤ UDP packet size) fits large
// key lists badly; and membership already comes from the discovery code kvroute has
// for workers. gRPC gives ordered, flow-controlled, size-bounded delivery per peer;
// failure detection is the stream breaking plus the silence timeout. There is no
// home-made gossip here: every replica talks to every peer directly.
//
// # Bounds
//
// The gRPC server bounds a message's size before reading it (MaxMessageBytes); the
// decoder checks every count against its limit (MaxWorkers, MaxKeysPerWorker,
// MaxEventsPerWorker, 253-byte names) and against the bytes left before allocating; at most MaxPeers peer states,
// 2×MaxPeers inbound streams and 4×MaxPeers connections are held over every connection, and
// MaxInboundBytes of summaries are received, decoded or applied at once (inbound.go). Every
// claim is cut to what a replica could hold (Claims), and streams authenticate (Auth). A malformed summary ends its stream
// (InvalidArgument) and drops that peer's state; the sender reconnects with backoff.
// A sender whose summary would exceed MaxMessageBytes halves its key lists until it fits.
//
// # Cost
//
// A summary is about 10 + 20 bytes per worker with open requests or recent writes + 8
// bytes per block key being prefilled + 1–3 bytes per first-token or finish time of
// the last 10 s; a replica sends it to N−1 peers at most 40 times a second.
// Memory per peer: the last summary's bookings per worker and its key set.
package peers
