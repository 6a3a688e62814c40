package scheduler

import "fmt"

// This file is the generation allocation ladder (spec §11) and its Helix
// variant (§13). Victims are always taken from the back of the list (newest
// first), never from the executing batch, and, except for the rung-2
// fallback, only from behind the requester.

// scheduleGeneration tries to give the generation request at index i one
// token of KV (§11).
func (s *Scheduler) scheduleGeneration(i int) outcome {
	r := s.list[i]
	if !s.canFit(1) {
		return stopped
	}
	if s.kv.TryAllocateGeneration(r) {
		return scheduled
	}
	if s.cfg.Policy == GuaranteedNoEvict {
		// A generation step draws from the request's reservation (§14.2).
		s.fatal = fmt.Errorf("%w for request %d (generation step)", ErrReservationViolated, r.ID)
		return aborted
	}
	if s.cfg.Helix {
		return s.helixLadder(i)
	}
	if s.rung1(i) {
		return scheduled
	}
	if s.cfg.RecomputePause && s.rung2(i) {
		return scheduled
	}
	s.rung3(i)
	return stopped
}

// started reports CONTEXT_IN_PROGRESS, GENERATION_IN_PROGRESS or
// GENERATION_TO_COMPLETE (§2.3).
func started(st State) bool {
	return st == ContextInProgress || st == GenerationInProgress || st == GenerationToComplete
}

// evictable is the suspend-victim predicate (§2.3): not executing, not a
// dummy, started, cache active.
func (s *Scheduler) evictable(r *Request) bool {
	return !r.IsDummy && started(r.State) && s.kv.IsActive(r.ID) && !s.isExecuting(r.ID)
}

// recomputeCandidate is the recompute-victim predicate (§2.3): not
// executing, not a dummy, CONTEXT_IN_PROGRESS or GENERATION_IN_PROGRESS
// (a GENERATION_TO_COMPLETE request's tokens are final), holds a cache.
// A reset prompt longer than M with chunking off is still re-prefilled, in
// chunks (rechunked), so the length of a victim does not matter.
func (s *Scheduler) recomputeCandidate(r *Request) bool {
	return !r.IsDummy && (r.State == ContextInProgress || r.State == GenerationInProgress) &&
		s.kv.HasCache(r.ID) && !s.isExecuting(r.ID)
}

// suspend clears x's batch slot, suspends its cache and reports it in Paused.
func (s *Scheduler) suspend(idx int) {
	x := s.list[idx]
	x.BatchIndex = NoBatchIndex
	s.kv.Suspend(x)
	s.out.Paused = append(s.out.Paused, x)
	s.pausedIdx = append(s.pausedIdx, int32(idx))
	s.flags[idx] |= flagPaused
}

// recomputePause frees x's cache and reports it in RecomputePaused; a request
// suspended earlier in this pass leaves Paused (§3).
func (s *Scheduler) recomputePause(idx int) {
	x := s.list[idx]
	if s.flags[idx]&flagPaused != 0 {
		s.unpause(idx)
	}
	s.kv.Free(x)
	x.BatchIndex = NoBatchIndex
	s.out.RecomputePaused = append(s.out.RecomputePaused, x)
}

// unpause removes the Paused entry of list index idx, keeping the order of the rest.
func (s *Scheduler) unpause(idx int) {
	for k, p := range s.pausedIdx {
		if int(p) == idx {
			s.out.Paused = append(s.out.Paused[:k], s.out.Paused[k+1:]...)
			s.pausedIdx = append(s.pausedIdx[:k], s.pausedIdx[k+1:]...)
			s.flags[idx] &^= flagPaused
			return
		}
	}
}

// rung1 suspends victims behind the requester, newest first, until the
// requester's allocation succeeds (§11.1). Only with a host tier: without
// one, suspension frees no device page. Each victim moves the ordinary
// frontier end down to it, so nothing at or behind it is visited this pass.
func (s *Scheduler) rung1(i int) bool {
	if !s.host {
		return false
	}
	r := s.list[i]
	for {
		v := -1
		for j := s.end - 1; j > i; j-- {
			if s.evictable(s.list[j]) {
				v = j
				break
			}
		}
		if v < 0 {
			return false
		}
		s.suspend(v)
		s.end = v
		if s.kv.TryAllocateGeneration(r) {
			return true
		}
	}
}

// rung2 recompute-pauses victims (§11.2): the newest recompute candidate
// behind the requester and below the recompute frontier; with a host tier,
// falling back to the first request suspended in this pass. fallback is
// false under Helix.
//
// Deliberate addition to §11.2: a candidate whose cache has no page on the
// device (with a host tier, a suspended cache whose every page migrated) is
// skipped: freeing it would cost the victim its KV and free no device page,
// and the requester would self-evict anyway (issue 9, defect 12). A
// suspended cache still on the device is a victim as the spec says (T-GEN-09).
func (s *Scheduler) rung2(i int) bool {
	r := s.list[i]
	for {
		v := -1
		for j := s.frontier - 1; j > i; j-- {
			if s.flags[j]&flagVictim == 0 && s.recomputeCandidate(s.list[j]) && s.kv.HoldsDevicePages(s.list[j].ID) {
				v = j
				break
			}
		}
		if v < 0 && s.host {
			for _, p := range s.pausedIdx {
				if s.flags[p]&flagVictim == 0 && s.recomputeCandidate(s.list[p]) && s.kv.HoldsDevicePages(s.list[p].ID) {
					v = int(p)
					break
				}
			}
		}
		if v < 0 {
			return false
		}
		s.recomputePause(v)
		s.flags[v] |= flagVictim
		s.frontier = min(s.frontier, v)
		if s.kv.TryAllocateGeneration(r) {
			return true
		}
		if s.host && s.rung1(i) {
			return true
		}
	}
}

// rung3 self-evicts the requester when its own cache is active (§11.3). An
// executing requester may self-evict. A requester whose cache is already
// suspended reports nothing.
func (s *Scheduler) rung3(i int) {
	if s.kv.IsActive(s.list[i].ID) {
		s.suspend(i)
	}
}

// helixLadder is the Helix allocation-failure path (§13): no suspension;
// recompute pause of a request behind the requester; otherwise sit out.
func (s *Scheduler) helixLadder(i int) outcome {
	r := s.list[i]
	if !s.cfg.RecomputePause {
		s.fatal = fmt.Errorf("%w: KV allocation failed for request %d under Helix and recompute pause is disabled; "+
			"enable recompute pause (%s) or size the pool with %s", ErrHelixNoRecompute, r.ID,
			s.cfg.Name(SettingRecomputePause), s.cfg.Name(SettingPoolSize))
		return aborted
	}
	if s.rung2(i) { // s.host is false under Helix: no fallback, no rung 1
		return scheduled
	}
	// Sit out: clearing the batch slot stops the overlap loop from reading a
	// stale slot at the request's next step.
	r.BatchIndex = NoBatchIndex
	s.out.SatOut = append(s.out.SatOut, r)
	s.note(LevelDebug, "helix: request %d found no free KV pages and no preemptible request; sitting out this step", r.ID)
	return stopped
}
