package nccl

// MaxTraceEntries is how many collectives a member's trace keeps (the
// most recent ones). Nothing in a run reads the trace: tests and
// diagnostics do, over a few thousand calls at most, while a server
// iterates for days, and each kept entry used to stay for the process's
// life (an idle fleet iterates every few milliseconds).
const MaxTraceEntries = 1 << 14

// traceLog is a member's trace: the last MaxTraceEntries collectives it
// entered, in call order.
type traceLog struct {
	buf   []TraceEntry
	start int // once buf is full: the index of its oldest entry
}

func (t *traceLog) add(e TraceEntry) {
	if len(t.buf) < MaxTraceEntries {
		t.buf = append(t.buf, e)
		return
	}
	t.buf[t.start] = e
	t.start = (t.start + 1) % MaxTraceEntries
}

// entries copies the kept entries, oldest first (nil when there are none).
func (t *traceLog) entries() []TraceEntry {
	if len(t.buf) == 0 {
		return nil
	}
	out := make([]TraceEntry, 0, len(t.buf))
	out = append(out, t.buf[t.start:]...)
	return append(out, t.buf[:t.start]...)
}

func (t *traceLog) reset() { t.buf, t.start = t.buf[:0], 0 }
