package fleet

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows how many requests are done: a bar on a terminal, plain
// lines (every 10% or 10 s) otherwise. It is called from rank 0's loop.
type progress struct {
	mu        sync.Mutex
	w         io.Writer
	mode      string // bar, lines, off
	total     int
	start     time.Time
	last      time.Time
	lastShown int
	lastBar   int
}

func newProgress(w io.Writer, mode string, total int) *progress {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				mode = "bar"
			}
		}
	}
	now := time.Now()
	return &progress{w: w, mode: mode, total: total, start: now, last: now, lastShown: -1, lastBar: -1}
}

func (p *progress) update(done int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	switch p.mode {
	case "bar":
		if done == p.lastBar && now.Sub(p.last) < time.Second {
			return
		}
		const width = 30
		filled := width * done / max(p.total, 1)
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d requests  %.1fs ", strings.Repeat("#", filled),
			strings.Repeat(".", width-filled), done, p.total, now.Sub(p.start).Seconds())
		p.lastBar, p.last = done, now
	case "lines":
		step := max(p.total/10, 1)
		if done == p.lastShown || (done/step == p.lastShown/step && now.Sub(p.last) < 10*time.Second && done != p.total) {
			return
		}
		fmt.Fprintf(p.w, "progress: %d/%d requests done, %.1fs\n", done, p.total, now.Sub(p.start).Seconds())
		p.lastShown, p.last = done, now
	}
}

func (p *progress) done() {
	if p.mode == "bar" {
		fmt.Fprintln(p.w)
	}
}
