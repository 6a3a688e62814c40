package scheduler

import "fmt"

// This file schedules one context request (spec §7): non-chunked and chunked
// sizing, unit rounding, the equal-cost cap (§9.3), the policy-specific
// allocation (§7.1 step 4, §14.2) and context preemption (§12).

// scheduleContext tries to schedule the context request at index idx. On
// SCHEDULED it returns the tokens to charge to the budget and whether the
// chunk is the prompt's last; r.ChunkSize is set. A first-chunk admission
// that does not end SCHEDULED is released (§7).
func (s *Scheduler) scheduleContext(idx int) (charged int, last bool, oc outcome) {
	r := s.list[idx]
	r.ChunkSize = 0
	first := r.State == ContextInit
	if s.st.chunked || s.rechunked(r) {
		charged, oc = s.chunked(idx)
	} else {
		charged, oc = s.nonChunked(idx)
	}
	if oc != scheduled {
		r.ChunkSize = 0
		if first && oc != aborted && s.admitted {
			s.kv.ReleaseContextAdmission(r)
		}
		return 0, false, oc
	}
	return charged, r.ChunkSize == r.Remaining(), scheduled
}

// rechunked reports a context that runs in chunks although chunking is off:
// a recompute-reset prompt (prompt plus every generated token, executor.md
// §11.2) with more than M tokens left, which outgrew M while it decoded
// (arrival rejects longer prompts, §1). A deliberate difference from the
// spec, which would schedule it whole and so never (the pass stalls until
// the fatal stall error, or, when no victim may be chosen, a pool of such
// requests deadlocks): its re-prefill is sized and allocated as chunking-on
// chunks are (§7.2: the budget, the unit, skip rather than stop).
// TensorRT-LLM instead cuts the reset prompt to the maximum input length
// and generates the cut tokens again (LlmRequest::pause); lockstep keeps
// every token the client received. It reads only the request and the
// configuration, so every CP rank decides alike.
func (s *Scheduler) rechunked(r *Request) bool {
	return r.Recomputed && !s.st.chunked && s.st.maxTokens != Unlimited && r.Remaining() > s.st.maxTokens
}

// nonChunked sizes and allocates a whole remaining prompt (§7.1). Non-chunked
// contexts are never cost-capped and never demoted.
func (s *Scheduler) nonChunked(idx int) (int, outcome) {
	r := s.list[idx]
	s.admitted = false
	pre := r.Remaining()
	if !s.cfg.PrefixAware && !s.canFit(pre) {
		return 0, stopped // strict FCFS
	}
	s.admitted = true
	if !s.kv.PrepareContext(r) {
		return 0, stopped
	}
	post := r.Remaining()
	if s.cfg.PrefixAware && !s.canFit(post) {
		return 0, stopped
	}
	r.ChunkSize = post
	if oc := s.allocateContext(idx, post); oc != scheduled {
		return 0, oc
	}
	if !s.cfg.PrefixAware {
		return pre, scheduled // the budget pays for tokens reuse will skip
	}
	return post, scheduled
}

// chunked sizes and allocates one chunk (§7.2).
func (s *Scheduler) chunked(idx int) (int, outcome) {
	r := s.list[idx]
	s.admitted = false
	pre := r.Remaining()
	if s.tokensLeft() < s.st.unit {
		return 0, skipped
	}
	s.admitted = true
	if !s.kv.PrepareContext(r) {
		return 0, skipped
	}
	post := r.Remaining()
	chunk := s.sizeChunk(pre, post, int64(r.ContextPosition))
	if chunk <= 0 {
		return 0, skipped
	}
	r.ChunkSize = min(chunk, post)
	if oc := s.allocateContext(idx, r.ChunkSize); oc != scheduled {
		return 0, oc
	}
	return chunk, scheduled // charged before the clip to post
}

// costCap applies the equal-cost cap to a chunk of a request at KV depth p
// (§9.3): what is affordable from the budget left, with the head-of-line
// floor F until the first chunk of the pass is committed.
func (s *Scheduler) costCap(chunk int, p int64) int {
	c := &s.st.cost
	num := c.budget - s.costUsed - c.r*p
	var aff int64
	if num > 0 {
		aff = num / (c.o + p)
	}
	if !s.committed {
		aff = max(aff, c.floor)
	}
	if aff < int64(chunk) {
		return int(aff)
	}
	return chunk
}

// allocateContext allocates n tokens of KV for the chunk (§7.1 step 4).
// MAX_UTILIZATION: resize; on failure, with a host tier, suspend victims
// behind the requester (suspendForContext); then try context preemption:
// STOP when a victim was freed (its pages wait for this request next pass),
// SKIP otherwise. GUARANTEED_NO_EVICT: a first chunk must reserve to completion or
// STOP; a continuation draws from its reservation and cannot fail.
func (s *Scheduler) allocateContext(idx, n int) outcome {
	r := s.list[idx]
	if s.cfg.Policy == GuaranteedNoEvict {
		if r.State == ContextInit {
			if s.kv.PrepareBlocksIfSchedulable(r, n) {
				return scheduled
			}
			// FCFS: a later, smaller first chunk is not tried (§14.2). A
			// deliberate difference: the spec STOPs the whole walk, so a
			// continuation behind this request (one admitted while this one
			// was deferred by the prefix-aware skip, §8) would never run
			// again while its reservation holds the pages this one waits
			// for: a deadlock. Continuations, which draw from their own
			// reservations and cannot fail, are still visited, as behind the
			// admission watermark.
			s.gated = true
			return skipped
		}
		if s.kv.ResizeContext(r, n) {
			return scheduled
		}
		s.fatal = fmt.Errorf("%w for request %d (continuation chunk of %d tokens)", ErrReservationViolated, r.ID, n)
		return aborted
	}
	if r.State == ContextInit && s.pages != nil && !s.watermarkAllows(r, n) {
		s.gated = true // no later first chunk is tried, none preempts
		return skipped
	}
	if s.kv.ResizeContext(r, n) {
		return scheduled
	}
	if s.host && s.suspendForContext(idx, n) {
		return scheduled
	}
	if s.cfg.RecomputePause && s.preemptForPages(idx) {
		return stopped
	}
	return skipped
}

// suspendForContext is the host-tier pressure valve for a context chunk
// (deliberate difference from spec §12, which allows no preemption at all
// with a host tier and leaves suspension to the generation ladder). It
// suspends evictable requests behind the requester, newest first, retrying
// the chunk's allocation after each (the suspended pages migrate to the
// host on demand), like rung 1 does for a generation step (§11.1).
//
// Why: when only context requests hold the device pool (several chunked
// prompts in progress, no generation request to run the ladder), every
// chunk allocation fails and nothing ever suspends anything: the scheduler
// stalls on a workload whose every request fits the pool alone. Taking
// victims only from behind the requester keeps the head of the list
// unpreemptable, so it always finishes. Requests scheduled in this pass,
// executing, or already victims are never taken.
func (s *Scheduler) suspendForContext(requesterIdx, n int) bool {
	r := s.list[requesterIdx]
	for j := len(s.list) - 1; j > requesterIdx; j-- {
		if s.flags[j]&(flagScheduled|flagPreempted|flagVictim|flagPaused) != 0 || !s.evictable(s.list[j]) {
			continue
		}
		s.suspend(j)
		if s.kv.ResizeContext(r, n) {
			return true
		}
	}
	return false
}

// preemptForPages frees the newest eligible victim for the context request
// at requesterIdx (§12) and reports whether it found one. Protected: requests
// scheduled in this pass and the requester. Under Helix only requests behind
// the requester qualify (§13), so the head of the list always finishes.
//
// A failed search is remembered for the rest of the pass (victimMemo): the
// candidate set only shrinks within a pass, so a later search need not scan
// the list again (issue 24: with thousands of waiting first chunks on a full
// pool, each one rescanned the list and found nothing). Same victims, same
// order as the full scan.
func (s *Scheduler) preemptForPages(requesterIdx int) bool {
	lo, hi := 0, len(s.list)-1
	if s.behindOnly() {
		lo = requesterIdx + 1
	}
	if m := &s.victims; m.on && m.failed {
		if s.behindOnly() {
			// Nothing behind the earlier requester qualified; it may itself.
			hi = min(hi, m.requester)
		} else {
			// Nothing but the earlier requester (excluded from its own
			// search) can qualify.
			lo, hi = m.requester, m.requester
		}
	}
	for j := hi; j >= lo; j-- {
		if j == requesterIdx || !s.victimEligible(j) {
			continue
		}
		s.recomputePause(j)
		s.flags[j] |= flagPreempted
		return true
	}
	if s.behindOnly() && s.victims.failed {
		s.victims.requester = min(s.victims.requester, requesterIdx)
	} else {
		s.victims.failed, s.victims.requester = true, requesterIdx
	}
	s.victims.requesterOut = false
	return false
}

// behindOnly reports whether a context preemption takes its victim only
// from behind the requester in arrival order: under Helix (§13), and,
// a deliberate difference from §12, whenever long-prefill demotion is on.
// Demotion's aging flips two long prefills' places in the visiting order
// every K + 1 passes; with victims from anywhere in the list, each, let
// through in its turn, recompute-paused the other (the newest other
// request) before either finished, when the pool held only one of them:
// a livelock that never tripped the stall detector (found by a sweep,
// seed 4 246 of TestRandomSchedulerKnobsServeOrRefuse). Behind only, the
// head of the list is never preempted by a later request, so it finishes.
func (s *Scheduler) behindOnly() bool { return s.cfg.Helix || s.st.demotion }

// victimEligible is the context-preemption victim predicate of list index j
// (the requester aside).
func (s *Scheduler) victimEligible(j int) bool {
	if s.flags[j]&(flagScheduled|flagPreempted|flagVictim) != 0 {
		return false
	}
	c := s.list[j]
	// Deliberate difference from spec §12: without a host tier a
	// suspended (self-evicted) cache still holds its device pages, so it
	// is a victim like an active one; skipping it livelocks a context
	// request behind a self-evicted generation request. With a host tier
	// (reached when suspendForContext could not free enough, e.g. the
	// host tier is full) the rule is the same: a cache is a victim when
	// freeing it frees a device page; one whose every page is on the
	// host is skipped, since freeing it would only lose its KV.
	return s.recomputeCandidate(c) && s.kv.HoldsDevicePages(c.ID)
}

// victimMemo remembers, within one pass, that a context-preemption search
// failed: then no request but the requester of that search (excluded from
// it) qualifies, or under Helix none behind it. It is kept only without a
// host tier (on): there a request resumed by PrepareContext and then skipped
// before its allocation could gain device pages and become a victim that
// the memo would miss; without one every cache holds its device pages and
// the candidate set only shrinks (flags are only set, states and the
// executing set are fixed, no candidate gains a cache).
type victimMemo struct {
	on        bool
	failed    bool
	requester int
	// requesterOut: the requester was found not to qualify, and so stays
	// for the rest of the pass (the candidate set only shrinks).
	requesterOut bool
}

// exhausted reports that no victim can be freed for the request at idx
// (when victims may come from anywhere in the list: its callers run only
// with the fast skip, which is off where they come from behind only):
// a search failed in this pass and its requester (the only request left
// open) is idx itself or does not qualify.
func (m *victimMemo) exhausted(s *Scheduler, idx int) bool {
	if !m.on || !m.failed {
		return false
	}
	if m.requester == idx || m.requesterOut {
		return true
	}
	if s.victimEligible(m.requester) {
		return false
	}
	m.requesterOut = true
	return true
}
