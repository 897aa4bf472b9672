package classify

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// The model file is gzip (RFC 1952) around:
//
//	"KVRLIN1\n"                         8 bytes, the format and its version
//	uint32 LE n, then n bytes of JSON    {"features": Features, "labels": [...], "scale": [...]}
//	int8 × (1<<bits)·K                   weights, W[f*K+c] ≈ q·scale[c]
//	float32 LE × K                       biases
//
// Weights are quantized per label column to int8 (scale[c] = max|W[·][c]|/127), which
// shrinks a 2^20-feature, 14-label model from 59 MB of float32 to 15 MB before gzip; the
// quantization error is below the accuracy's third decimal on the MMLU-Pro example
// (docs/classification.md).
const modelMagic = "KVRLIN1\n"

// maxHeaderBytes bounds the JSON header a model file may declare.
const maxHeaderBytes = 1 << 20

type modelHeader struct {
	Features Features  `json:"features"`
	Labels   []string  `json:"labels"`
	Scale    []float32 `json:"scale"`
}

// Save writes m to path (atomically: a temporary file renamed over it).
func (m *Linear) Save(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := m.write(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func (m *Linear) write(w io.Writer) error {
	k := len(m.Labels)
	scale := make([]float32, k)
	for i, v := range m.W {
		if a := float32(math.Abs(float64(v))); a > scale[i%k] {
			scale[i%k] = a
		}
	}
	for c := range scale {
		scale[c] /= 127
		if scale[c] == 0 {
			scale[c] = 1
		}
	}
	hdr, err := json.Marshal(modelHeader{Features: m.Features, Labels: m.Labels, Scale: scale})
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	bw := bufio.NewWriterSize(zw, 1<<16)
	bw.WriteString(modelMagic)
	binary.Write(bw, binary.LittleEndian, uint32(len(hdr)))
	bw.Write(hdr)
	for i, v := range m.W {
		q := math.Round(float64(v / scale[i%k]))
		bw.WriteByte(byte(int8(max(-127, min(127, q)))))
	}
	binary.Write(bw, binary.LittleEndian, m.B)
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// ErrModelFormat is returned (wrapped) by Load for a file that is not a model this
// version reads.
var ErrModelFormat = errors.New("classify: not a kvroute linear model")

// Load reads a model written by Save. It checks the header's sizes before allocating.
func Load(path string) (*Linear, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func read(r io.Reader) (*Linear, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrModelFormat, err)
	}
	br := bufio.NewReaderSize(zr, 1<<16)
	magic := make([]byte, len(modelMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != modelMagic {
		return nil, ErrModelFormat
	}
	var n uint32
	if err := binary.Read(br, binary.LittleEndian, &n); err != nil || n > maxHeaderBytes {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrModelFormat, n)
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(br, hb); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrModelFormat, err)
	}
	var h modelHeader
	if err := json.Unmarshal(hb, &h); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrModelFormat, err)
	}
	if err := h.Features.validate(); err != nil {
		return nil, err
	}
	k := len(h.Labels)
	if k < 2 || k > MaxLabels || len(h.Scale) != k {
		return nil, fmt.Errorf("%w: %d labels, %d scales", ErrModelFormat, k, len(h.Scale))
	}
	m := &Linear{Features: h.Features, Labels: h.Labels,
		W: make([]float32, (1<<h.Features.Bits)*k), B: make([]float32, k)}
	q := make([]byte, 1<<16)
	for off := 0; off < len(m.W); {
		chunk := q[:min(len(q), len(m.W)-off)]
		if _, err := io.ReadFull(br, chunk); err != nil {
			return nil, fmt.Errorf("%w: weights: %v", ErrModelFormat, err)
		}
		for i, b := range chunk {
			m.W[off+i] = float32(int8(b)) * h.Scale[(off+i)%k]
		}
		off += len(chunk)
	}
	if err := binary.Read(br, binary.LittleEndian, m.B); err != nil {
		return nil, fmt.Errorf("%w: biases: %v", ErrModelFormat, err)
	}
	return m, nil
}

// roundTrip returns m as Save then Load would: with its weights quantized.
func roundTrip(m *Linear) (*Linear, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(m.write(pw)) }()
	out, err := read(pr)
	pr.Close()
	return out, err
}
