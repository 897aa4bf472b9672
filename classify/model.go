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
//	"KVRLIN2\n"                         8 bytes, the format and its version
//	uint32 LE n, then n bytes of JSON    {"features", "labels", "rows", "scale", "idf_scale", "idf_default"}
//	uvarint × rows                       each row's bucket minus the previous row's (the first: itself)
//	uint8 × rows                         each row's idf ≈ q·idf_scale
//	int8 × rows·K                        weights, W[i*K+c] ≈ q·scale[c]
//	float32 LE × K                       biases
//
// Only rows (features) with a weight are written, and weights are quantized per label
// column to int8 (scale[c] = max|W[·][c]|/127): the MMLU-Pro example with 100,000 rows is
// under 1 MiB (docs/classification.md), and its accuracy is measured on the file.
const modelMagic = "KVRLIN2\n"

const (
	// maxHeaderBytes bounds the JSON header a model file may declare.
	maxHeaderBytes = 1 << 20
	// maxWeights bounds rows × labels a model file may declare (512 MiB of float32).
	maxWeights = 1 << 27
)

type modelHeader struct {
	Features   Features  `json:"features"`
	Labels     []string  `json:"labels"`
	Rows       int       `json:"rows"`
	Scale      []float32 `json:"scale"`
	IDFScale   float32   `json:"idf_scale"`
	IDFDefault float32   `json:"idf_default"`
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
	q := m.quantizer()
	scale, idfScale := q.scale, q.idfScale
	hdr, err := json.Marshal(modelHeader{Features: m.Features, Labels: m.Labels, Rows: len(m.Buckets),
		Scale: scale, IDFScale: idfScale, IDFDefault: m.IDFDefault})
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(w, gzip.BestCompression)
	bw := bufio.NewWriterSize(zw, 1<<16)
	bw.WriteString(modelMagic)
	binary.Write(bw, binary.LittleEndian, uint32(len(hdr)))
	bw.Write(hdr)
	var vb [binary.MaxVarintLen32]byte
	prev := uint32(0)
	for _, b := range m.Buckets {
		bw.Write(vb[:binary.PutUvarint(vb[:], uint64(b-prev))])
		prev = b
	}
	for _, v := range m.IDF {
		bw.WriteByte(q.idf(v))
	}
	for i, v := range m.W {
		bw.WriteByte(q.weight(v, i%k))
	}
	binary.Write(bw, binary.LittleEndian, m.B)
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// ErrModelFormat is returned (wrapped) by Load for a file that is not a model this
// version reads.
var ErrModelFormat = errors.New("classify: not a kvroute linear model (version 2)")

// Load reads a model written by Save. It checks the header's sizes before allocating
// and every row's bucket against the feature space.
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
	if h.Rows < 0 || h.Rows > 1<<h.Features.Bits || h.Rows*k > maxWeights {
		return nil, fmt.Errorf("%w: %d rows of %d labels over 2^%d features", ErrModelFormat, h.Rows, k, h.Features.Bits)
	}
	m := &Linear{Features: h.Features, Labels: h.Labels, IDFDefault: h.IDFDefault, B: make([]float32, k)}
	// rows are read before their weights are allocated: a short file fails early.
	m.Buckets = make([]uint32, 0, min(h.Rows, 1<<16))
	prev := uint64(0)
	for i := 0; i < h.Rows; i++ {
		d, err := binary.ReadUvarint(br)
		if err != nil {
			return nil, fmt.Errorf("%w: row %d: %v", ErrModelFormat, i, err)
		}
		b := prev + d
		if (i > 0 && d == 0) || b >= 1<<h.Features.Bits {
			return nil, fmt.Errorf("%w: row %d: bucket %d out of order or outside 2^%d", ErrModelFormat, i, b, h.Features.Bits)
		}
		m.Buckets = append(m.Buckets, uint32(b))
		prev = b
	}
	q := make([]byte, h.Rows)
	if _, err := io.ReadFull(br, q); err != nil {
		return nil, fmt.Errorf("%w: idf: %v", ErrModelFormat, err)
	}
	m.IDF = make([]float32, h.Rows)
	for i, v := range q {
		m.IDF[i] = float32(v) * h.IDFScale
	}
	m.W = make([]float32, h.Rows*k)
	q = make([]byte, 1<<16)
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
	m.index()
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

// quantizer is how the model file stores weights and idf, and how Predict's packed
// table holds them: each label's weights as int8 scaled by scale[c] = max|W[·][c]|/127,
// each row's idf as uint8 scaled by idfScale = max idf/255 (a zero scale is 1).
type quantizer struct {
	scale    []float32
	idfScale float32
}

func (m *Linear) quantizer() quantizer {
	k := len(m.Labels)
	q := quantizer{scale: make([]float32, k)}
	for i, v := range m.W {
		q.scale[i%k] = max(q.scale[i%k], float32(math.Abs(float64(v))))
	}
	for c := range q.scale {
		if q.scale[c] /= 127; q.scale[c] == 0 {
			q.scale[c] = 1
		}
	}
	for _, v := range m.IDF {
		q.idfScale = max(q.idfScale, v)
	}
	if q.idfScale /= 255; q.idfScale == 0 {
		q.idfScale = 1
	}
	return q
}

// weight quantizes label c's weight v.
func (q quantizer) weight(v float32, c int) byte {
	return byte(int8(max(-127, min(127, math.Round(float64(v/q.scale[c]))))))
}

// idf quantizes an idf.
func (q quantizer) idf(v float32) byte {
	return byte(max(0, min(255, math.Round(float64(v/q.idfScale)))))
}
