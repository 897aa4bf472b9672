package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestIndexDefaultsValid(t *testing.T) {
	if err := defaultIndex().validate(); err != nil {
		t.Fatalf("defaults must validate: %v", err)
	}
}

func TestIndexValidate(t *testing.T) {
	for key, mut := range map[string]func(*Index){
		"index.speculative_ttl":      func(i *Index) { i.SpeculativeTTL = -time.Second },
		"index.max_bytes":            func(i *Index) { i.MaxBytes = -1 },
		"index.queue_size":           func(i *Index) { i.QueueSize = 0 },
		"index.replay_timeout":       func(i *Index) { i.ReplayTimeout = 0 },
		"index.reconnect_max":        func(i *Index) { i.ReconnectMax = time.Millisecond },
		"index.topic_pattern":        func(i *Index) { i.TopicPattern = "kv@{model}" },
		"index.bind_endpoint":        func(i *Index) { i.BindEndpoint = "http://x" },
		"index.sweep_interval":       func(i *Index) { i.SweepInterval = 0 },
		"index.max_message_bytes":    func(i *Index) { i.MaxMessageBytes = 100 },
		"index.replay_backoff_min":   func(i *Index) { i.ReplayBackoffMin = 0 },
		"index.replay_backoff_max":   func(i *Index) { i.ReplayBackoffMax = time.Millisecond },
		"index.replay_buffer_frames": func(i *Index) { i.ReplayBufferFrames = -1 },
		"index.replay_buffer_bytes":  func(i *Index) { i.ReplayBufferBytes = 4096 }, // below one max message
		"index.silent_after":         func(i *Index) { i.SilentAfter = -time.Second },
	} {
		i := defaultIndex()
		mut(&i)
		var fe *FieldError
		if err := i.validate(); !errors.As(err, &fe) || fe.Key != key {
			t.Errorf("%s: got %v, want an error naming the key", key, err)
		}
	}
}

func TestIndexKeysFromEnvironment(t *testing.T) {
	env := map[string]string{
		"KVROUTE_INDEX_KV_CACHE_SPEC_KINDS": "[full_attention, sliding_window]",
		"KVROUTE_INDEX_BIND_ENDPOINT":       "tcp://*:5557",
		"KVROUTE_INDEX_MAX_BYTES":           "1000000",
	}
	c, err := Load(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Index.SpecKinds, ",") != "full_attention,sliding_window" || c.Index.BindEndpoint != "tcp://*:5557" || c.Index.MaxBytes != 1e6 {
		t.Fatalf("%+v", c.Index)
	}
}
