package kvpool_test

import (
	"math/rand/v2"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Deliberate difference (issue 24): a first-chunk admission released
// unscheduled leaves the LRU order of the cached blocks it claimed as it
// was. A's blocks are the oldest cached ones; C claims them, cannot get its
// chunk's pages and is released; the next allocation still evicts A's leaf
// first (before, C's attempt stamped A's blocks as just used and B's leaf
// went first).
func TestReleasedAdmissionKeepsLRUOrder(t *testing.T) {
	m := newCfg(t, reuseCfg(4))
	a := preq(1, span(1, 8), 1)
	runAndFree(t, m, a) // two cached blocks: [1-4] → [5-8]
	runAndFree(t, m, preq(2, span(101, 108), 1))
	eventsOf(m, 0)
	c := preq(3, cat(span(1, 8), span(300, 340)), 1)
	if !m.PrepareContext(c) || c.ContextPosition != 8 {
		t.Fatalf("C claims A's prefix: position %d", c.ContextPosition)
	}
	if m.ResizeContext(c, c.Remaining()) {
		t.Fatal("C's chunk fits a pool of 4 pages")
	}
	m.ReleaseContextAdmission(c)
	mustCheck(t, m)
	prefill(t, m, preq(4, span(600, 603), 1)) // one page: evicts the oldest cached leaf
	removed := eventsOf(m, kvpool.EventRemoved)
	want := kvpool.BlockKeyOf(kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4)), span(5, 8))
	if len(removed) != 1 || len(removed[0].Hashes) != 1 || removed[0].Hashes[0] != want {
		t.Fatalf("evicted %+v, want A's leaf %x", removed, want[:4])
	}
}

// FirstChunkBlocked promises only what a real attempt confirms: on pools
// of shared-prefix prompts in random states, whenever it answers true for
// a waiting request, admitting it and allocating its chunk fails, and
// releasing the admission leaves the pool's summary, invariants and next
// eviction as they were. NoFirstChunkFits likewise.
func TestFirstChunkBlockedHolds(t *testing.T) {
	promised := 0
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 24))
		m := newCfg(t, kvpool.Config{NumPages: 6 + rng.IntN(10), TokensPerPage: 4, EnableBlockReuse: true,
			EventBufferMaxSize: 1000})
		var live []*scheduler.Request
		id := uint64(0)
		prompt := func() []int32 {
			// A shared stem of 0–3 blocks, sometimes a partial block more,
			// then a private tail.
			p := span(1, int32(4*rng.IntN(4)+rng.IntN(3)))
			base := int32(1000 * (id + 1))
			return cat(p, span(base, base+int32(rng.IntN(30))))
		}
		for step := 0; step < 60; step++ {
			id++
			r := preq(id, prompt(), 1)
			switch rng.IntN(3) {
			case 0: // run a request to the end and free it: its blocks become cached
				if m.PrepareContext(r) && m.ResizeContext(r, r.Remaining()) {
					r.ContextPosition = r.PromptLen
					m.UpdateAfterContext(r)
					m.Free(r)
				} else {
					m.ReleaseContextAdmission(r)
				}
			case 1: // keep one running
				if m.PrepareContext(r) && m.ResizeContext(r, r.Remaining()) {
					r.ContextPosition = r.PromptLen
					m.UpdateAfterContext(r)
					live = append(live, r)
				} else {
					m.ReleaseContextAdmission(r)
				}
			case 2: // end a running one
				if len(live) > 0 {
					k := rng.IntN(len(live))
					m.Free(live[k])
					live = append(live[:k], live[k+1:]...)
				}
			}
			m.TakeCopies()
			eventsOf(m, 0)
			// A waiting request: does the promise hold?
			id++
			w := preq(id, prompt(), 1)
			n := 1 + rng.IntN(40)
			chunkOf := func(r *scheduler.Request, matched int) int { return min(n, r.PromptLen-matched) }
			blocked, none := m.FirstChunkBlocked(w, chunkOf), m.NoFirstChunkFits()
			if !blocked && !none {
				continue
			}
			promised++
			before := m.String()
			ok := m.PrepareContext(w)
			if ok {
				ok = m.ResizeContext(w, min(n, w.Remaining()))
			}
			if ok {
				t.Fatalf("seed %d step %d: blocked=%v none=%v, yet request %d's chunk of %d was allocated (%s)",
					seed, step, blocked, none, w.ID, n, before)
			}
			m.ReleaseContextAdmission(w)
			mustCheck(t, m)
			if after := m.String(); after != before {
				t.Fatalf("seed %d step %d: the failed admission changed the pool: %s → %s", seed, step, before, after)
			}
			if copies := m.TakeCopies(); len(copies) != 0 {
				t.Fatalf("seed %d step %d: the failed admission queued copies %v", seed, step, copies)
			}
			if evs := eventsOf(m, 0); len(evs) != 0 {
				t.Fatalf("seed %d step %d: the failed admission emitted %v", seed, step, evs)
			}
		}
	}
	if promised == 0 {
		t.Fatal("no state made a promise: the test checks nothing")
	}
}
