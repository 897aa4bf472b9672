package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"
)

// palette of line colours (colour-blind friendly, Okabe–Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

type series struct {
	name string
	xs   []float64
	ys   []float64
}

type chart struct {
	title, xlabel, ylabel string
	logX                  bool
	series                []series
}

const (
	svgW, svgH             = 720.0, 440.0
	padL, padR, padT, padB = 64.0, 170.0, 40.0, 52.0
)

// niceTicks returns about n round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Floor(lo/step) * step; v <= hi+step/2; v += step {
		out = append(out, v)
	}
	return out
}

func (c *chart) write(w io.Writer) {
	var xmin, xmax, ymax float64 = math.Inf(1), math.Inf(-1), 0
	for _, s := range c.series {
		for i := range s.xs {
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			ymax = math.Max(ymax, s.ys[i])
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	tx := func(v float64) float64 { return v }
	if c.logX {
		xmin = math.Max(xmin, 1e-3)
		tx = func(v float64) float64 { return math.Log10(math.Max(v, 1e-3)) }
	} else {
		xmin = math.Min(xmin, 0)
	}
	if ymax == 0 {
		ymax = 1
	}
	x0, x1 := tx(xmin), tx(xmax)
	if x1 <= x0 {
		x1 = x0 + 1
	}
	pw, ph := svgW-padL-padR, svgH-padT-padB
	X := func(v float64) float64 { return padL + (tx(v)-x0)/(x1-x0)*pw }
	Y := func(v float64) float64 { return padT + ph - v/ymax*ph }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(c.title))
	// grid and ticks
	for _, v := range niceTicks(0, ymax, 5) {
		if v > ymax*1.0001 {
			continue
		}
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			padL, padL+pw, Y(v), Y(v), padL-6, Y(v)+4, tick(v))
	}
	var xt []float64
	if c.logX {
		for e := math.Floor(x0); e <= math.Ceil(x1); e++ {
			for _, m := range []float64{1, 2, 5} {
				v := m * math.Pow(10, e)
				if tx(v) >= x0-1e-9 && tx(v) <= x1+1e-9 {
					xt = append(xt, v)
				}
			}
		}
	} else {
		xt = niceTicks(xmin, xmax, 6)
	}
	for _, v := range xt {
		if X(v) < padL-0.5 || X(v) > padL+pw+0.5 {
			continue
		}
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
			X(v), X(v), padT, padT+ph, X(v), padT+ph+16, tick(v))
	}
	fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", padL, padT, pw, ph)
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", padL+pw/2, svgH-12, html.EscapeString(c.xlabel))
	fmt.Fprintf(w, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+ph/2, html.EscapeString(c.ylabel))
	for i, s := range c.series {
		col := palette[i%len(palette)]
		var pts []string
		for j := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", X(s.xs[j]), Y(s.ys[j])))
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		if len(s.xs) < 20 {
			for j := range s.xs {
				fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", X(s.xs[j]), Y(s.ys[j]), col)
			}
		}
		ly := padT + 10 + float64(i)*18
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			padL+pw+12, padL+pw+32, ly, ly, col, padL+pw+38, ly+4, html.EscapeString(s.name))
	}
	fmt.Fprintln(w, `</svg>`)
}

func tick(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", v), "0"), ".")
	default:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
	}
}

// WriteCDF writes the TTFT CDF of each summary (one line per policy) for one arrivals group.
func WriteCDF(w io.Writer, title string, ss []Summary) {
	c := chart{title: title, xlabel: "time to first token (s, log scale)", ylabel: "fraction of requests", logX: true}
	for _, s := range ss {
		var xs []float64
		for _, r := range s.Results {
			if r.Err == "" {
				xs = append(xs, r.TTFT.Seconds())
			}
		}
		sort.Float64s(xs)
		se := series{name: s.Policy}
		for i, x := range xs {
			se.xs = append(se.xs, x)
			se.ys = append(se.ys, float64(i+1)/float64(len(xs)))
		}
		c.series = append(c.series, se)
	}
	c.write(w)
}

// LoadPoint is one summary at one offered load.
type LoadPoint struct {
	Load float64 // requests per second offered
	S    Summary
}

// WriteTTFTvsLoad writes p50 and p90 TTFT against offered load, one line per policy and percentile.
func WriteTTFTvsLoad(w io.Writer, title string, pts []LoadPoint) {
	c := chart{title: title, xlabel: "offered load (requests/s)", ylabel: "TTFT (s)"}
	by := map[string]*[2]series{}
	var order []string
	for _, p := range pts {
		s, ok := by[p.S.Policy]
		if !ok {
			s = &[2]series{{name: p.S.Policy + " p50"}, {name: p.S.Policy + " p90"}}
			by[p.S.Policy] = s
			order = append(order, p.S.Policy)
		}
		s[0].xs, s[0].ys = append(s[0].xs, p.Load), append(s[0].ys, p.S.TTFTp50)
		s[1].xs, s[1].ys = append(s[1].xs, p.Load), append(s[1].ys, p.S.TTFTp90)
	}
	for _, n := range order {
		c.series = append(c.series, by[n][1])
	}
	c.write(w)
}
