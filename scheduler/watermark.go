package scheduler

import "fmt"

// The decode-growth admission watermark (Config.AdmissionLookahead, W):
// MAX_UTILIZATION's guard against thrashing under KV pressure (issue 24,
// docs/scheduling.md "Admission watermark").
//
// Without it MAX_UTILIZATION admits a first chunk whenever its pages are
// free right now. When every request decodes for long, the running set
// soon outgrows the pool; the generation ladder then recompute-pauses and
// self-evicts, and the pages a victim frees are handed at once to the next
// first chunk (often the victim itself, back in CONTEXT_INIT), which
// brings the pressure straight back: a cycle of prefill, preemption and
// recompute. The watermark keeps, when it admits a new context, a reserve
// of obtainable pages for the growth of what already runs over the next W
// iterations (vLLM's block-manager watermark and its lookahead slots, sized
// by the running decodes instead of a fixed share of the pool); and it is
// also the hysteresis after a preemption: a victim's freed pages are below
// the reserve, so nothing new is admitted until requests finish.
//
// Rank invariance: the reserve reads the active list's states and the
// ledger's obtainable pages, both identical on every CP rank under Helix
// (kvcache.md §10); attention-DP ranks each decide on their own list.

// PageCounter is the optional side of a KVManager the watermark reads.
type PageCounter interface {
	// ObtainablePages is the number of ledger pages a MAX_UTILIZATION
	// allocation could obtain now (free, cached and evictable, migratable
	// to a host tier), less the pages reserved.
	ObtainablePages() int
}

// watermarkOn reports whether the watermark applies to this scheduler.
func (s *Scheduler) watermarkOn() bool {
	return s.cfg.AdmissionLookahead > 0 && s.cfg.Policy == MaxUtilization
}

// newWatermark checks the watermark's needs at New.
func (s *Scheduler) newWatermark() error {
	if !s.watermarkOn() {
		return nil
	}
	if s.cfg.LedgerBlockTokens < 1 {
		return fmt.Errorf("%w: %s = %d needs the ledger block size (tokens per page), have %d",
			ErrConfig, s.cfg.Name(SettingAdmissionLookahead), s.cfg.AdmissionLookahead, s.cfg.LedgerBlockTokens)
	}
	pc, ok := s.kv.(PageCounter)
	if !ok {
		return fmt.Errorf("%w: %s = %d needs a KV manager that counts its obtainable pages (%T does not)",
			ErrConfig, s.cfg.Name(SettingAdmissionLookahead), s.cfg.AdmissionLookahead, s.kv)
	}
	s.pages = pc
	return nil
}

// watermarkAllows reports whether the first chunk of r, n tokens from its
// context position (past any claimed prefix), may be allocated: the pages
// it takes must leave ceil((running+1)·W / B) obtainable pages, where
// running counts the requests past their first chunk (CONTEXT_IN_PROGRESS
// and GENERATION_IN_PROGRESS) and the 1 is r's own growth. With nothing
// running it always allows, so an idle rank never waits on its reserve.
func (s *Scheduler) watermarkAllows(r *Request, n int) bool {
	if s.running < 0 {
		s.running = 0
		for _, c := range s.list {
			if !c.IsDummy && (c.State == ContextInProgress || c.State == GenerationInProgress) {
				s.running++
			}
		}
	}
	if s.running == 0 {
		return true
	}
	b := s.cfg.LedgerBlockTokens
	pos := r.ContextPosition
	need := (pos+n+b-1)/b - pos/b
	reserve := ((s.running+1)*s.cfg.AdmissionLookahead + b - 1) / b
	return s.pages.ObtainablePages()-need >= reserve
}
