package scheduler

// This file is long-prefill demotion (spec §10): a reorder of phase 2, never
// a cap. Long requests go behind the others; after K consecutive demoted
// passes one is let through in arrival order until it is scheduled.

// demoteEntry is one aging counter. idx is the request's last known index in
// the active list; the sweep uses it to find the request again cheaply
// (the list only loses entries ahead of it and gains entries at its end).
type demoteEntry struct {
	count int64
	idx   int32
}

// demotionCounters holds the aging counters (§10.4). With K = 0 the map stays
// empty. Map iteration order never decides anything: each entry is handled
// on its own.
type demotionCounters struct {
	counts map[uint64]demoteEntry
}

// long is the classification predicate of §10.2. A request without an
// estimate is never long; a first chunk is judged on its estimate (the
// scheduler never probes the radix tree); a continuation on its exact remainder.
func (s *Scheduler) long(r *Request) bool {
	switch {
	case r.UncachedEstimate < 0:
		return false
	case r.State == ContextInit:
		return r.UncachedEstimate > s.cfg.Demotion.UncachedTokens
	default:
		return int64(r.Remaining()) > s.cfg.Demotion.UncachedTokens
	}
}

// classify classifies every pending request, fills Output.Demoted and
// returns the phase-2 order: NORMAL and LET_THROUGH in list order, then
// DEMOTED in list order (§10.3). Identity when demotion is off.
func (d *demotionCounters) classify(s *Scheduler) []int32 {
	if !s.st.demotion {
		return s.pending
	}
	k := s.cfg.Demotion.MaxIters
	order := s.order[:0]
	for _, idx := range s.pending {
		r := s.list[idx]
		if !s.long(r) {
			if k > 0 {
				delete(d.counts, r.ID)
			}
			order = append(order, idx)
			continue
		}
		if e, ok := d.counts[r.ID]; k > 0 && ok && e.count >= k {
			s.flags[idx] |= flagLetThrough
			order = append(order, idx)
			continue
		}
		s.flags[idx] |= flagDemoted
		s.out.Demoted = append(s.out.Demoted, r.ID)
	}
	for _, idx := range s.pending {
		if s.flags[idx]&flagDemoted != 0 {
			order = append(order, idx)
		}
	}
	s.order = order
	return order
}

// update applies the once-per-pass counter actions of §10.4 after phase 2,
// then sweeps entries whose request left the active list.
func (d *demotionCounters) update(s *Scheduler) {
	if !s.st.demotion || s.cfg.Demotion.MaxIters <= 0 {
		return
	}
	for _, idx := range s.pending {
		f := s.flags[idx]
		id := s.list[idx].ID
		switch {
		case f&flagDemoted != 0:
			e := d.counts[id]
			d.counts[id] = demoteEntry{count: e.count + 1, idx: idx}
		case f&flagLetThrough != 0 && f&flagScheduled != 0:
			delete(d.counts, id)
		}
	}
	d.sweep(s.list)
}

// sweep deletes the entries of requests no longer in list (finished,
// cancelled, failed) so that the map never grows without bound. An entry's
// index is refreshed when its request moved towards the head.
func (d *demotionCounters) sweep(list []*Request) {
	for id, e := range d.counts {
		if at := findID(list, id, int(e.idx)); at < 0 {
			delete(d.counts, id)
		} else if at != int(e.idx) {
			d.counts[id] = demoteEntry{count: e.count, idx: int32(at)}
		}
	}
}

// findID returns the index of id in list, searching from hint towards the
// head first (removals only shift requests down), then the rest; -1 if absent.
func findID(list []*Request, id uint64, hint int) int {
	hint = min(hint, len(list)-1)
	for j := hint; j >= 0; j-- {
		if list[j].ID == id {
			return j
		}
	}
	for j := hint + 1; j < len(list); j++ {
		if list[j].ID == id {
			return j
		}
	}
	return -1
}
