package kvevents

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// withUnknownKeys builds a map batch whose batch and event maps carry keys this
// package does not know, the way a future vLLM might.
func withUnknownKeys(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeMapLen(3)
	_ = e.EncodeString("ts")
	_ = e.EncodeFloat64(1)
	_ = e.EncodeString("x")
	_ = e.Encode(map[string]any{"a": []int{1, 2}})
	_ = e.EncodeString("events")
	_ = e.EncodeArrayLen(1)
	_ = e.EncodeMapLen(3)
	_ = e.EncodeString("future")
	_ = e.Encode([]any{1, "two", nil})
	_ = e.EncodeString("type")
	_ = e.EncodeString("BlockRemoved")
	_ = e.EncodeString("block_hashes")
	_ = e.Encode([]uint64{5})
	return buf.Bytes()
}
