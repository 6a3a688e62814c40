package kvpool_test

import (
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// newCfg builds a manager from cfg or fails the test.
func newCfg(t testing.TB, cfg kvpool.Config) *kvpool.Manager {
	t.Helper()
	m, err := kvpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// reuseCfg is a P = 4 configuration with block reuse on and events on.
func reuseCfg(pages int) kvpool.Config {
	return kvpool.Config{NumPages: pages, TokensPerPage: 4, EnableBlockReuse: true, EventBufferMaxSize: 1000, MaxSeqLen: 1000}
}

// span is the tokens a, a+1, …, b.
func span(a, b int32) []int32 {
	var out []int32
	for t := a; t <= b; t++ {
		out = append(out, t)
	}
	return out
}

// cat concatenates token lists.
func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// preq is a first-chunk request whose prompt is tokens.
func preq(id uint64, tokens []int32, maxNew int) *scheduler.Request {
	r := req(id, len(tokens), maxNew)
	r.Tokens = tokens
	return r
}

// chunk admits and runs one context chunk of r ending at position end, as
// the scheduler and executor would: PrepareContext, ResizeContext, advance
// the position, UpdateAfterContext.
func chunk(t testing.TB, m *kvpool.Manager, r *scheduler.Request, end int) {
	t.Helper()
	if !m.PrepareContext(r) {
		t.Fatalf("PrepareContext of request %d failed", r.ID)
	}
	if end < r.ContextPosition {
		end = r.ContextPosition
	}
	if !m.ResizeContext(r, end-r.ContextPosition) {
		t.Fatalf("ResizeContext of request %d to %d failed", r.ID, end)
	}
	r.ContextPosition = end
	m.UpdateAfterContext(r)
	if end == r.PromptLen {
		r.State = scheduler.GenerationInProgress
	} else {
		r.State = scheduler.ContextInProgress
	}
}

// prefill runs r's whole prompt as one chunk.
func prefill(t testing.TB, m *kvpool.Manager, r *scheduler.Request) {
	t.Helper()
	chunk(t, m, r, r.PromptLen)
}

// runAndFree prefills r and closes its cache.
func runAndFree(t testing.TB, m *kvpool.Manager, r *scheduler.Request) {
	t.Helper()
	prefill(t, m, r)
	m.Free(r)
	mustCheck(t, m)
}

// mustCheck fails the test on a broken invariant.
func mustCheck(t testing.TB, m *kvpool.Manager) {
	t.Helper()
	if err := m.CheckInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// info returns id's sequence snapshot or fails.
func info(t testing.TB, m *kvpool.Manager, id uint64) kvpool.SequenceInfo {
	t.Helper()
	s, ok := m.Sequence(id)
	if !ok {
		t.Fatalf("request %d has no cache", id)
	}
	return s
}

// eventsOf flushes m's events, keeping those of kind k (all when k = 0).
func eventsOf(m *kvpool.Manager, k kvpool.EventKind) []kvpool.Event {
	var out []kvpool.Event
	for _, e := range m.FlushIterationEvents() {
		if k == 0 || e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// storedKeys lists the keys of every stored block in evs, in order.
func storedKeys(evs []kvpool.Event) []scheduler.BlockKey {
	var out []scheduler.BlockKey
	for _, e := range evs {
		for _, b := range e.Blocks {
			out = append(out, b.Hash)
		}
	}
	return out
}
