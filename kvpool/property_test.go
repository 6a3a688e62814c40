package kvpool_test

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// modelSeq is the naive reference model's view of one sequence.
type modelSeq struct {
	active   bool
	capacity int
	history  int
	target   int // reservation target in pages; 0 = none
	grown    bool
}

// model is a naive reference for the Manager: counts only, no page indices,
// reservations recomputed from scratch every time.
type model struct {
	pages, p, maxCap int
	free             int
	seqs             map[uint64]*modelSeq
}

func (m *model) pagesOf(s *modelSeq) int { return (s.capacity + m.p - 1) / m.p }

func (m *model) reservedExcept(skip *modelSeq) int {
	total := 0
	for _, s := range m.seqs {
		if s != skip {
			total += max(0, s.target-m.pagesOf(s))
		}
	}
	return total
}

// setCapacity applies an all-or-nothing resize in the model.
func (m *model) setCapacity(s *modelSeq, c int) bool {
	if m.maxCap > 0 && c > m.maxCap {
		return false
	}
	need := (c+m.p-1)/m.p - m.pagesOf(s)
	after := max(0, s.target-m.pagesOf(s)-need)
	if need > 0 && m.free-need < m.reservedExcept(s)+after {
		return false
	}
	m.free -= need
	s.capacity = c
	return true
}

// TestPropertyAgainstModel drives the Manager and the model with the same
// random operations and compares them after every step.
func TestPropertyAgainstModel(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runProperty(t, seed, 400) })
	}
}

func runProperty(t *testing.T, seed int64, steps int) {
	rng := rand.New(rand.NewSource(seed))
	cfg := kvpool.Config{NumPages: 4 + rng.Intn(40), TokensPerPage: 1 + rng.Intn(8)}
	if rng.Intn(2) == 0 {
		cfg.MaxSeqLen = 8 + rng.Intn(60)
	}
	mgr, err := kvpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := &model{pages: cfg.NumPages, p: cfg.TokensPerPage, free: cfg.NumPages, seqs: map[uint64]*modelSeq{}}
	if cfg.MaxSeqLen > 0 {
		ref.maxCap = cfg.MaxSeqLen + 1
	}
	reqs := map[uint64]*scheduler.Request{}
	const ids = 10
	for step := range steps {
		id := uint64(rng.Intn(ids))
		r := reqs[id]
		if r == nil {
			r = req(id, 1+rng.Intn(40), rng.Intn(30))
			reqs[id] = r
		}
		s := ref.seqs[id]
		var op string
		switch k := rng.Intn(10); k {
		case 0: // create or resume
			op = "prepare"
			got := mgr.PrepareContext(r)
			if s == nil {
				s = &modelSeq{}
				ref.seqs[id] = s
			}
			s.active = true
			expect(t, step, op, got, true)
		case 1, 2: // context resize
			if s == nil || !s.active {
				continue
			}
			op = "resize"
			n := rng.Intn(3 * cfg.TokensPerPage)
			r.ContextPosition = s.capacity
			want := ref.setCapacity(s, s.capacity+n)
			expect(t, step, op, mgr.ResizeContext(r, n), want)
		case 3, 4: // generation growth
			if s == nil {
				expect(t, step, "grow-missing", mgr.TryAllocateGeneration(r), false)
				continue
			}
			op = "grow"
			wasActive := s.active
			s.active = true
			want := ref.setCapacity(s, s.capacity+1)
			if want {
				s.grown = true
			} else {
				s.active = wasActive
			}
			expect(t, step, op, mgr.TryAllocateGeneration(r), want)
		case 5: // revert
			op = "revert"
			mgr.RevertAllocateGeneration(r)
			if s != nil && s.grown {
				s.grown = false
				ref.free += ref.pagesOf(s)
				s.capacity--
				ref.free -= ref.pagesOf(s)
			}
		case 6: // suspend
			op = "suspend"
			mgr.Suspend(r)
			if s != nil {
				s.active = false
			}
		case 7: // free
			op = "free"
			mgr.Free(r)
			if s != nil {
				ref.free += ref.pagesOf(s)
				delete(ref.seqs, id)
				delete(reqs, id)
			}
		case 8: // step ran: history catches up with capacity
			if s == nil {
				continue
			}
			op = "update"
			r.ContextPosition = s.capacity
			mgr.UpdateAfterContext(r)
			s.history = s.capacity
			s.grown = false
			r.Generated = s.capacity - r.PromptLen + 1
			mgr.UpdateAfterGeneration(r)
		case 9: // dummy or GUARANTEED_NO_EVICT admission of a fresh request
			if s != nil {
				continue
			}
			if rng.Intn(2) == 0 {
				op = "dummy"
				tokens := rng.Intn(2 * cfg.TokensPerPage)
				ns := &modelSeq{active: true}
				ref.seqs[id] = ns
				want := ref.setCapacity(ns, tokens)
				if !want {
					delete(ref.seqs, id)
				}
				expect(t, step, op, mgr.AddDummy(r, tokens), want)
				continue
			}
			op = "admit"
			n := min(r.PromptLen, 1+rng.Intn(2*cfg.TokensPerPage))
			ptc := mgr.PagesToCompletion(r)
			ns := &modelSeq{active: true, target: ptc}
			want := ptc <= ref.free-ref.reservedExcept(nil)
			if want {
				ref.seqs[id] = ns
				want = ref.setCapacity(ns, n)
				if !want {
					delete(ref.seqs, id)
				}
			}
			r.ContextPosition = 0
			expect(t, step, op, mgr.PrepareBlocksIfSchedulable(r, n), want)
		}
		compare(t, step, op, mgr, ref)
	}
}

func expect(t *testing.T, step int, op string, got, want bool) {
	t.Helper()
	if got != want {
		t.Fatalf("step %d %s: got %v, model says %v", step, op, got, want)
	}
}

func compare(t *testing.T, step int, op string, mgr *kvpool.Manager, ref *model) {
	t.Helper()
	if err := mgr.CheckInvariants(); err != nil {
		t.Fatalf("step %d %s: invariants: %v", step, op, err)
	}
	if mgr.FreePages() != ref.free {
		t.Fatalf("step %d %s: free %d, model %d", step, op, mgr.FreePages(), ref.free)
	}
	if got, want := mgr.ReservedPages(), ref.reservedExcept(nil); got != want {
		t.Fatalf("step %d %s: reserved %d, model %d", step, op, got, want)
	}
	if mgr.NumSequences() != len(ref.seqs) {
		t.Fatalf("step %d %s: %d sequences, model %d", step, op, mgr.NumSequences(), len(ref.seqs))
	}
	for id, s := range ref.seqs {
		if mgr.Capacity(id) != s.capacity || len(mgr.BlockTable(id)) != ref.pagesOf(s) || mgr.IsActive(id) != s.active {
			t.Fatalf("step %d %s: request %d capacity %d pages %d active %v; model %d %d %v", step, op, id,
				mgr.Capacity(id), len(mgr.BlockTable(id)), mgr.IsActive(id), s.capacity, ref.pagesOf(s), s.active)
		}
	}
}
