package router

// LoadEntry is one request of a rank's active list as the state gather
// sees it (spec §1.3).
type LoadEntry struct {
	// PromptLen is the original prompt length at arrival (not the current
	// prompt after a recompute reset).
	PromptLen int
	// Retiring is true for GENERATION_TO_COMPLETE: the overlap loop tears the
	// request down one iteration late, so it no longer counts as load.
	Retiring bool
	// Dummy marks a padding request; never counted.
	Dummy bool
}

// LocalState is the rank state rank contributes to the allgather: every
// non-dummy, non-retiring request counts (suspended and recompute-paused
// ones included) with its original prompt length; retiring ones are only
// counted in RetiringRequests.
func LocalState(rank int, active []LoadEntry) RankState {
	s := RankState{Rank: rank}
	for _, e := range active {
		switch {
		case e.Dummy:
		case e.Retiring:
			s.RetiringRequests++
		default:
			s.ActiveRequests++
			s.ActiveTokens += int64(e.PromptLen)
		}
	}
	return s
}

// WithoutRetiring returns a new slice holding the requests for which
// retiring is false, in order, and the number removed. reqs is not modified.
func WithoutRetiring[T any](reqs []T, retiring func(T) bool) (kept []T, numRetiring int) {
	kept = make([]T, 0, len(reqs))
	for _, r := range reqs {
		if retiring(r) {
			numRetiring++
			continue
		}
		kept = append(kept, r)
	}
	return kept, numRetiring
}
