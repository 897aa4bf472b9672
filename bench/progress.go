package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line progress bar on a terminal.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	last  time.Time
	start time.Time
}

// NewProgress returns a bar writing to w, or nil when mode is "never", or "auto" and w
// is not a terminal. A nil *Progress does nothing.
func NewProgress(w *os.File, mode string) *Progress {
	switch mode {
	case "never":
		return nil
	case "always":
	default:
		fi, err := w.Stat()
		if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			return nil
		}
	}
	return &Progress{w: w}
}

// Start begins a new bar.
func (p *Progress) Start(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label, p.start, p.last = label, time.Now(), time.Time{}
	p.mu.Unlock()
}

// Update draws done of total (at most 10 times a second, always at the end).
func (p *Progress) Update(done, total int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if done < total && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 30
	n := 0
	if total > 0 {
		n = done * width / total
	}
	fmt.Fprintf(p.w, "\r%-28s [%s%s] %d/%d %5.1fs", p.label, strings.Repeat("#", n), strings.Repeat(" ", width-n), done, total, time.Since(p.start).Seconds())
	if done >= total {
		fmt.Fprintln(p.w)
	}
}
