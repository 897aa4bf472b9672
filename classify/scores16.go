package classify

import "encoding/binary"

// xScale is the fixed-point scale of a feature's weight x = (1 + ln tf) · idf in
// scores16: x is summed as round(x · xScale) in integer lanes.
const xScale = 8

// flushEvery bounds the hits summed in 32-bit lanes before they are moved to 64 bits:
// a lane gains at most 255 · round(xScale · (1 + ln tf) · 255) per hit, under 2^23 for
// tf below 2^13 (a 4 KB window has fewer occurrences), so 256 hits stay under 2^31.
const flushEvery = 256

// scores16 sums the quantized scores of hits over 16-byte rows into out (len K ≤ 15)
// and returns Σ x² (x in idfScale units), for the l2 norm.
//
// It multiplies two of a row's biased weight bytes at a time (SWAR, "SIMD within a
// register": Fisher and Dietz, LCPC 1998): a row's 16 bytes are two 64-bit words; the
// mask 0x000000FF000000FF picks bytes i and i+4 into the two 32-bit halves, whose
// product by the integer x cannot carry from one half into the other. Four shifts
// cover a word, so a hit costs 8 multiplies for its 16 lanes instead of 16 float
// conversions, multiplies and adds. The bias is removed once at the end: Σ (w+128)·x =
// Σ w·x + 128 · Σ x.
func (p *packed) scores16(hits []hit, out []float32) (norm float32) {
	const m = 0x000000FF000000FF
	var lanes [8]uint64 // lanes[j]: bytes j and j+4 of word 0 (j < 4) or word 1 (j ≥ 4)
	var tot [16]uint64
	var sumX uint64
	flush := func() {
		for j, l := range lanes {
			w := j / 4 * 8
			tot[w+j%4] += l & 0xFFFFFFFF
			tot[w+j%4+4] += l >> 32
		}
		lanes = [8]uint64{}
	}
	for i, h := range hits {
		row := p.rows[int(h.row)*16 : int(h.row)*16+16]
		a := binary.LittleEndian.Uint64(row[:8])
		b := binary.LittleEndian.Uint64(row[8:])
		xf := h.tf * float32(row[15])
		norm += xf * xf
		x := uint64(xf*xScale + 0.5)
		sumX += x
		lanes[0] += a & m * x
		lanes[1] += a >> 8 & m * x
		lanes[2] += a >> 16 & m * x
		lanes[3] += a >> 24 & m * x
		lanes[4] += b & m * x
		lanes[5] += b >> 8 & m * x
		lanes[6] += b >> 16 & m * x
		lanes[7] += b >> 24 & m * x
		if i%flushEvery == flushEvery-1 {
			flush()
		}
	}
	flush()
	for c := range out {
		out[c] = float32(int64(tot[c])-128*int64(sumX)) / xScale
	}
	return norm
}
