package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// wireVersion is the first byte of every summary sent. A receiver decodes versions
// minWireVersion..wireVersion (a version-1 sender, during a rolling upgrade, carries no
// writes or first-token / finish times) and drops others.
const (
	wireVersion    = 2
	minWireVersion = 1
)

// Limits bound what a decoder accepts; every count is checked against them and against
// the bytes left before anything is allocated.
type Limits struct {
	MaxWorkers       int // workers per summary
	MaxKeysPerWorker int // block keys per worker
	MaxNameBytes     int // replica id and worker name length, bytes
	// MaxEventsPerWorker bounds each of a worker's first-token and finish time lists;
	// 0 means router.MaxLeftEvents.
	MaxEventsPerWorker int
}

// Summary is one replica's in-flight state, the message peers exchange. A summary is
// complete (not a delta): the receiver replaces what it held from the sender.
type Summary struct {
	Replica     string // sender's replica id
	Incarnation uint64 // random per process start: a restarted replica's Seq starts over
	Seq         uint64 // grows with every summary of one incarnation
	Sent        time.Time
	Workers     []WorkerSummary
}

// WorkerSummary is the sender's bookings on one worker.
type WorkerSummary struct {
	Worker        string
	Booked        scoring.Booked
	OldestPrefill time.Time     // start of its oldest still-prefilling request; zero none
	Keys          []kvindex.Key // block keys being prefilled (speculative entries it created)
	// Writes is the sender's policy's decayed cache writes to the worker as of Sent,
	// tokens (router.WorkerBookings.Writes; whole tokens on the wire).
	Writes float64
	// FirstTokens and Finished are when the sender's requests on the worker left its
	// waiting queue / running set (router.WorkerBookings), ascending, millisecond
	// resolution, none after Sent.
	FirstTokens, Finished []time.Time
}

// Encoding (all integers unsigned varints unless said otherwise):
//
//	version(1 byte, 2) len(replica) replica incarnation seq sent_unix_ms n_workers
//	n_workers × { len(name) name requests prefilling prefill_tokens decoding
//	              oldest_prefill_unix_ms(0 none) n_keys n_keys × key(8 bytes little endian)
//	              writes_tokens n_first n_first × ms_before_sent
//	              n_finished n_finished × ms_before_sent }
//
// Version 2 added writes and the first-token / finish times (ms before sent_unix_ms,
// so a time costs 1–3 bytes); a version-1 summary ends each worker after its keys and
// still decodes (those fields empty), so replicas of both versions share bookings.

// encode appends s's encoding to dst.
func encode(dst []byte, s *Summary) []byte { return encodeVersion(dst, s, wireVersion) }

// encodeVersion appends s's encoding in the given wire version (1 omits the version-2
// fields); the version-1 form exists for the mixed-version test.
func encodeVersion(dst []byte, s *Summary, version byte) []byte {
	dst = append(dst, version)
	dst = appendString(dst, s.Replica)
	dst = binary.AppendUvarint(dst, s.Incarnation)
	dst = binary.AppendUvarint(dst, s.Seq)
	dst = binary.AppendUvarint(dst, unixMs(s.Sent))
	dst = binary.AppendUvarint(dst, uint64(len(s.Workers)))
	for i := range s.Workers {
		w := &s.Workers[i]
		dst = appendString(dst, w.Worker)
		for _, v := range [...]int{w.Booked.Requests, w.Booked.Prefilling, w.Booked.PrefillTokens, w.Booked.Decoding} {
			dst = binary.AppendUvarint(dst, uint64(max(v, 0)))
		}
		dst = binary.AppendUvarint(dst, unixMs(w.OldestPrefill))
		dst = binary.AppendUvarint(dst, uint64(len(w.Keys)))
		for _, k := range w.Keys {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(k))
		}
		if version < 2 {
			continue
		}
		dst = binary.AppendUvarint(dst, uint64(math.Round(min(max(w.Writes, 0), maxCount))))
		dst = appendTimes(dst, w.FirstTokens, s.Sent)
		dst = appendTimes(dst, w.Finished, s.Sent)
	}
	return dst
}

// appendTimes appends n and each time as milliseconds before sent (0 for a time at or
// after sent, or for a zero sent).
func appendTimes(dst []byte, ts []time.Time, sent time.Time) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ts)))
	for _, t := range ts {
		dst = binary.AppendUvarint(dst, uint64(max(sent.Sub(t).Milliseconds(), 0)))
	}
	return dst
}

func unixMs(t time.Time) uint64 {
	if t.IsZero() || t.UnixMilli() <= 0 {
		return 0
	}
	return uint64(t.UnixMilli())
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// errMalformed wraps every decoding error.
var errMalformed = errors.New("malformed peer summary")

type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{errMalformed}, args...)...)
	}
}

func (r *reader) uvarint(what string, limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: bad varint", what)
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.fail("%s: %d exceeds %d", what, v, limit)
		return 0
	}
	return v
}

func (r *reader) str(what string, limit int) string {
	n := r.uvarint(what+" length", uint64(limit))
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.fail("%s: %d bytes, %d left", what, n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// times reads a count (≤ limit, and ≤ the bytes left: a time takes at least one) and
// that many times as milliseconds before sent; nil for none.
func (r *reader) times(what string, limit int, sent time.Time) []time.Time {
	if limit <= 0 {
		limit = router.MaxLeftEvents
	}
	n := r.uvarint(what, uint64(limit))
	if r.err == nil && n > uint64(len(r.b)) {
		r.fail("%s: %d in %d bytes", what, n, len(r.b))
	}
	if r.err != nil || n == 0 {
		return nil
	}
	out := make([]time.Time, n)
	for i := range out {
		out[i] = sent.Add(-time.Duration(r.uvarint(what, maxAgeMs)) * time.Millisecond)
	}
	if r.err != nil {
		return nil
	}
	return out
}

// maxAgeMs bounds a time's milliseconds before sent (about 35 years: no overflow of a
// time.Duration).
const maxAgeMs = 1 << 40

// maxCount bounds the booked counts (requests, tokens) a summary may carry.
const maxCount = 1 << 40

// decode parses one summary within lim. Every count is checked against its limit and
// against the bytes left (a worker takes at least 8 bytes, a key 8) before allocating.
func decode(b []byte, lim Limits) (*Summary, error) {
	if len(b) == 0 || b[0] < minWireVersion || b[0] > wireVersion {
		return nil, fmt.Errorf("%w: unknown version", errMalformed)
	}
	version := b[0]
	r := &reader{b: b[1:]}
	s := &Summary{}
	s.Replica = r.str("replica", lim.MaxNameBytes)
	s.Incarnation = r.uvarint("incarnation", ^uint64(0))
	s.Seq = r.uvarint("seq", ^uint64(0))
	if ms := r.uvarint("sent", 1<<53); ms > 0 {
		s.Sent = time.UnixMilli(int64(ms))
	}
	nw := r.uvarint("workers", uint64(lim.MaxWorkers))
	if r.err == nil && nw > uint64(len(r.b)/8) {
		r.fail("workers: %d in %d bytes", nw, len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	if s.Replica == "" {
		return nil, fmt.Errorf("%w: empty replica id", errMalformed)
	}
	s.Workers = make([]WorkerSummary, nw)
	for i := range s.Workers {
		w := &s.Workers[i]
		w.Worker = r.str("worker name", lim.MaxNameBytes)
		w.Booked.Requests = int(r.uvarint("requests", maxCount))
		w.Booked.Prefilling = int(r.uvarint("prefilling", maxCount))
		w.Booked.PrefillTokens = int(r.uvarint("prefill_tokens", maxCount))
		w.Booked.Decoding = int(r.uvarint("decoding", maxCount))
		if ms := r.uvarint("oldest_prefill", 1<<53); ms > 0 {
			w.OldestPrefill = time.UnixMilli(int64(ms))
		}
		nk := r.uvarint("keys", uint64(lim.MaxKeysPerWorker))
		if r.err == nil && nk > uint64(len(r.b)/8) {
			r.fail("keys: %d in %d bytes", nk, len(r.b))
		}
		if r.err != nil {
			return nil, r.err
		}
		if nk > 0 {
			w.Keys = make([]kvindex.Key, nk)
			for j := range w.Keys {
				w.Keys[j] = kvindex.Key(binary.LittleEndian.Uint64(r.b[8*j:]))
			}
			r.b = r.b[8*nk:]
		}
		if version < 2 {
			continue
		}
		w.Writes = float64(r.uvarint("writes", maxCount))
		w.FirstTokens = r.times("first_tokens", lim.MaxEventsPerWorker, s.Sent)
		w.Finished = r.times("finished", lim.MaxEventsPerWorker, s.Sent)
		if r.err != nil {
			return nil, r.err
		}
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errMalformed, len(r.b))
	}
	return s, nil
}
