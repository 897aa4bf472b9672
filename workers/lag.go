package workers

import (
	"context"
	"sync"
	"time"
)

// lagSamples bounds the heartbeat history a LagMonitor keeps: at the default 50 ms period
// it covers 12.8 s, more than the longest scrape timeout (5 s).
const lagSamples = 256

// LagMonitor measures how late kvroute's own goroutines run: a heartbeat goroutine
// sleeps Period, then records by how much its wake-up ran past the time it was due
// (scheduling delay: the process starved of CPU, GC assists, a runnable queue hundreds
// of goroutines long). A scrape that timed out while this lag was large timed out
// because kvroute could not run its side of the exchange, not because the worker was
// slow (Scraper). Safe for concurrent use.
type LagMonitor struct {
	period time.Duration
	now    func() time.Time

	mu   sync.Mutex
	due  time.Time // next heartbeat due; zero while not running
	ring [lagSamples]lagSample
	next int // ring write position
}

type lagSample struct {
	at  time.Time     // when the heartbeat ran
	lag time.Duration // how late it ran (at − due)
}

// NewLagMonitor returns a monitor with a heartbeat every period (0 → 50 ms); nothing
// is measured until Run.
func NewLagMonitor(period time.Duration) *LagMonitor {
	if period <= 0 {
		period = 50 * time.Millisecond
	}
	return &LagMonitor{period: period, now: time.Now}
}

// Run beats until ctx is cancelled.
func (m *LagMonitor) Run(ctx context.Context) {
	m.beat(m.now())
	t := time.NewTimer(m.period)
	defer t.Stop()
	defer func() { m.mu.Lock(); m.due = time.Time{}; m.mu.Unlock() }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.beat(m.now())
		t.Reset(m.period)
	}
}

// beat records the heartbeat that ran at now and schedules the next one.
func (m *LagMonitor) beat(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.due.IsZero() {
		m.ring[m.next] = lagSample{at: now, lag: max(0, now.Sub(m.due))}
		m.next = (m.next + 1) % lagSamples
	}
	m.due = now.Add(m.period)
}

// Max returns the largest scheduling delay seen in [from, to]: the recorded heartbeats
// that ran in it, and the heartbeat still pending at to if it is already overdue (a
// starved heartbeat has not run yet). 0 when the monitor is not running.
func (m *LagMonitor) Max(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lag time.Duration
	if !m.due.IsZero() && to.After(m.due) {
		lag = to.Sub(m.due)
	}
	for _, s := range m.ring {
		if !s.at.Before(from) && !s.at.After(to) && s.lag > lag {
			lag = s.lag
		}
	}
	return lag
}
