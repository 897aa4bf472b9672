package config

import (
	"strings"
	"time"

	"github.com/kvroute/kvroute/kvindex/zmqsub"
)

// Index configures the KV prefix index and its KV event subscriptions.
type Index struct {
	// SpeculativeTTL is how long blocks booked at pick time count as cached without a
	// confirming KV event. 0 disables speculative entries (and approximate mode for
	// workers without events).
	SpeculativeTTL time.Duration `mapstructure:"speculative_ttl"`
	// MaxBytes caps the index's estimated memory; past it the least recently used
	// entries are evicted. 0 means no cap.
	MaxBytes int64 `mapstructure:"max_bytes"`
	// QueueSize bounds each worker's queue of received, unapplied KV event messages; a
	// full queue drops (counted) and triggers a replay of that worker.
	QueueSize int `mapstructure:"queue_size"`
	// ReplayTimeout bounds one replay exchange with a worker's replay endpoint.
	ReplayTimeout time.Duration `mapstructure:"replay_timeout"`
	// ReconnectMin and ReconnectMax bound the backoff between socket re-creations
	// (also ZMQ's reconnect interval and its maximum): doubling per consecutive
	// unhealthy socket, back to ReconnectMin after one that received a well-formed
	// frame or stayed connected for ReconnectMax.
	ReconnectMin time.Duration `mapstructure:"reconnect_min"`
	ReconnectMax time.Duration `mapstructure:"reconnect_max"`
	// BindEndpoint, when set, is bound by one SUB socket that workers' publishers connect
	// to (vLLM --kv-events-config endpoint without "*"), e.g. "tcp://*:5557". "" = off.
	BindEndpoint string `mapstructure:"bind_endpoint"`
	// TopicPattern attributes bind-mode messages to workers: {addr} is the worker's
	// address, {model} a model name.
	TopicPattern string `mapstructure:"topic_pattern"`
	// SpecKinds are the kv_cache_spec_kind values whose KV cache groups are indexed
	// (events without a kind, from older vLLM, always are).
	SpecKinds []string `mapstructure:"kv_cache_spec_kinds"`
	// SweepInterval is how often expired speculative entries are removed.
	SweepInterval time.Duration `mapstructure:"sweep_interval"`
	// MaxMessageBytes caps each KV event message part (ZMQ_MAXMSGSIZE on every socket):
	// a peer sending more is disconnected before the message is read.
	MaxMessageBytes int64 `mapstructure:"max_message_bytes"`
	// ReplayBackoffMin and ReplayBackoffMax bound the per-worker backoff after a replay
	// request that got no answer; gaps inside it are not replayed.
	ReplayBackoffMin time.Duration `mapstructure:"replay_backoff_min"`
	ReplayBackoffMax time.Duration `mapstructure:"replay_backoff_max"`
	// ReplayBufferFrames and ReplayBufferBytes bound each worker's reorder buffer, where
	// live KV event messages wait (in seq order) while a replay is in flight; a message
	// that would exceed either abandons the replay (the buffered messages are applied,
	// the worker goes approximate). 0 means index.queue_size messages and
	// 2 × index.max_message_bytes.
	ReplayBufferFrames int   `mapstructure:"replay_buffer_frames"`
	ReplayBufferBytes  int64 `mapstructure:"replay_buffer_bytes"`
}

func defaultIndex() Index {
	z := zmqsub.DefaultOptions() // each default is written once, in the package that uses it
	return Index{
		SpeculativeTTL: 30 * time.Second,
		MaxBytes:       1 << 30,
		QueueSize:      z.QueueSize,
		ReplayTimeout:  z.ReplayTimeout,
		ReconnectMin:   z.ReconnectMin,
		ReconnectMax:   z.ReconnectMax,
		TopicPattern:   z.TopicPattern,
		SpecKinds:      []string{"full_attention"},
		SweepInterval:  z.SweepEvery,
		// the largest legitimate batch (a 1M-token context stored in one step) is ~6 MB;
		// see zmqsub.DefaultMaxMessageBytes
		MaxMessageBytes:  z.MaxMessageBytes,
		ReplayBackoffMin: z.ReplayBackoffMin,
		ReplayBackoffMax: z.ReplayBackoffMax,
	}
}

func (i Index) validate() error {
	switch {
	case i.SpeculativeTTL < 0:
		return fieldErr("index.speculative_ttl", "must be ≥ 0, got %s", i.SpeculativeTTL)
	case i.MaxBytes < 0:
		return fieldErr("index.max_bytes", "must be ≥ 0 (0 = no cap), got %d", i.MaxBytes)
	case i.QueueSize < 1:
		return fieldErr("index.queue_size", "must be ≥ 1 message, got %d", i.QueueSize)
	case i.ReplayTimeout <= 0:
		return fieldErr("index.replay_timeout", "must be > 0, got %s", i.ReplayTimeout)
	case i.ReconnectMin <= 0:
		return fieldErr("index.reconnect_min", "must be > 0, got %s", i.ReconnectMin)
	case i.ReconnectMax < i.ReconnectMin:
		return fieldErr("index.reconnect_max", "must be ≥ index.reconnect_min (%s), got %s", i.ReconnectMin, i.ReconnectMax)
	case !strings.Contains(i.TopicPattern, "{addr}"):
		return fieldErr("index.topic_pattern", "must contain {addr} to attribute messages to workers, got %q", i.TopicPattern)
	case i.BindEndpoint != "" && !strings.HasPrefix(i.BindEndpoint, "tcp://") && !strings.HasPrefix(i.BindEndpoint, "ipc://"):
		return fieldErr("index.bind_endpoint", "must be a tcp:// or ipc:// ZMQ endpoint, got %q", i.BindEndpoint)
	case i.SweepInterval <= 0:
		return fieldErr("index.sweep_interval", "must be > 0, got %s", i.SweepInterval)
	case i.MaxMessageBytes < 4096:
		return fieldErr("index.max_message_bytes", "must be ≥ 4096 bytes, got %d", i.MaxMessageBytes)
	case i.ReplayBackoffMin <= 0:
		return fieldErr("index.replay_backoff_min", "must be > 0, got %s", i.ReplayBackoffMin)
	case i.ReplayBackoffMax < i.ReplayBackoffMin:
		return fieldErr("index.replay_backoff_max", "must be ≥ index.replay_backoff_min (%s), got %s", i.ReplayBackoffMin, i.ReplayBackoffMax)
	case i.ReplayBufferFrames < 0:
		return fieldErr("index.replay_buffer_frames", "must be ≥ 0 messages (0 = index.queue_size), got %d", i.ReplayBufferFrames)
	case i.ReplayBufferBytes != 0 && i.ReplayBufferBytes < i.MaxMessageBytes:
		return fieldErr("index.replay_buffer_bytes", "must be 0 (2 × index.max_message_bytes) or ≥ index.max_message_bytes (%d, one message must fit), got %d", i.MaxMessageBytes, i.ReplayBufferBytes)
	}
	return nil
}
