package kvindex

import (
	"encoding/binary"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Key identifies one full block of tokens together with everything before it:
// Key_i = xxhash64(Key_{i-1} ‖ token_ids of block i), Key_{-1} = Namespace.Seed().
// Keys are kvroute's own; they never depend on vLLM's engine hash algorithm or seed.
type Key uint64

// Namespace separates prefix caches that must never share blocks even for equal
// tokens: different models, LoRA adapters, or vLLM cache_salt values.
type Namespace struct {
	Model     string // served model name (base model, not the adapter)
	LoRA      string // LoRA adapter name, "" for none
	CacheSalt string // vLLM cache_salt, "" for none
}

// Seed is the chain's initial parent key: xxhash64 of the namespace fields, each
// length-prefixed so that ("ab","c") and ("a","bc") differ.
func (ns Namespace) Seed() Key {
	var d xxhash.Digest
	d.Reset()
	var n [4]byte
	for _, s := range [...]string{ns.Model, ns.LoRA, ns.CacheSalt} {
		binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
		_, _ = d.Write(n[:])
		_, _ = d.WriteString(s)
	}
	return Key(d.Sum64())
}

// HashBlocks appends to dst the chained keys of every full block of tokens
// (len(tokens)/blockSize keys; a trailing partial block is not keyed, as vLLM caches
// only full blocks) and returns the extended slice. parent is the key of the block
// before tokens[0], or Namespace.Seed() at the start of a sequence.
func HashBlocks(parent Key, tokens []uint32, blockSize int, dst []Key) []Key {
	if blockSize <= 0 {
		return dst
	}
	need := 8 + 4*blockSize
	var buf [8 + 4*256]byte
	b := buf[:]
	if need > len(buf) {
		b = make([]byte, need)
	}
	b = b[:need]
	for len(tokens) >= blockSize {
		blk := tokens[:blockSize]
		binary.LittleEndian.PutUint64(b, uint64(parent))
		if nativeLittle { // the ids' memory is already their little-endian bytes
			copy(b[8:], unsafe.Slice((*byte)(unsafe.Pointer(&blk[0])), 4*blockSize))
		} else {
			for i, t := range blk {
				binary.LittleEndian.PutUint32(b[8+4*i:], t)
			}
		}
		parent = Key(xxhash.Sum64(b))
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// nativeLittle reports whether this machine stores integers little endian (amd64,
// arm64, …), so that a []uint32's bytes are the hashed bytes as they lie.
var nativeLittle = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// putKeyTokens writes parent (little endian) then tokens (little endian uint32) into b,
// which must be 8+4*len(tokens) bytes: the bytes hashed for one block.
func putKeyTokens(b []byte, parent Key, tokens []uint32) {
	binary.LittleEndian.PutUint64(b, uint64(parent))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[8+4*i:], t)
	}
}
