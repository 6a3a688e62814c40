package costfit

import "slices"

// RankSample is one rank's statistics of one iteration as every rank
// gathers them (executor.md §13.3, router-and-calibration.md §10.2).
type RankSample struct {
	N         int64   // scheduled tokens, context and generation
	S         int64   // floor(cost_s) = floor(Σ chunk·(kv + chunk/2))
	WallMS    float64 // the rank's host wall time of the iteration
	CtxTokens int64   // context tokens (Σ chunk sizes)
}

// ObserveFleet feeds one iteration's gathered per-rank statistics (index =
// attention-DP rank) and then refreshes as MaybeRefresh(iter) does. It is
// the executor's once-per-iteration call on every rank.
//
// With LockstepCorrection (§10.2) the observation is the same on every rank:
// the lockstep time T = median over ranks of WallMS is paired with the
// bottleneck rank's (N, S), and every rank with context work adds its
// midpoint depth S / CtxTokens, weighted by CtxTokens, to the histogram. The
// contract that makes the publications identical: every rank passes the
// same ranks slice (same order, same values) and the same iter, at the same
// iteration. self is then unused.
//
// Without the correction only ranks[self] is observed (its own N, S and
// wall time, its midpoint depth): the per-rank calibrator of §9 whose
// publications differ between ranks under attention DP (§10.1). self must
// index ranks.
//
// An empty ranks observes nothing.
func (c *Calibrator) ObserveFleet(iter int64, self int, ranks []RankSample) (pub Publication, changed bool) {
	if len(ranks) > 0 {
		if !c.set.LockstepCorrection {
			if self < 0 || self >= len(ranks) {
				panic("costfit: ObserveFleet self rank outside the gathered vector")
			}
			own := ranks[self]
			c.ObserveIteration(own.N, own.S, own.WallMS)
			c.observeMidpoint(own)
		} else {
			c.walls = c.walls[:0]
			for _, r := range ranks {
				c.walls = append(c.walls, r.WallMS)
			}
			slices.Sort(c.walls)
			b := ranks[c.bottleneck(ranks)]
			c.ObserveIteration(b.N, b.S, medianSorted(c.walls))
			for _, r := range ranks {
				c.observeMidpoint(r)
			}
		}
	}
	return c.MaybeRefresh(iter)
}

// observeMidpoint adds a rank's context work at its token-weighted midpoint
// depth (§10.2 step 3).
func (c *Calibrator) observeMidpoint(r RankSample) {
	if r.CtxTokens > 0 {
		c.ObserveChunk(r.S/r.CtxTokens, r.CtxTokens)
	}
}

// bottleneck is §10.2's r*: the rank with the largest predicted cost
// A·N/M + c2·S under the published model, or before the first publication
// the largest (S, N); ties go to the lowest rank. It reads only gathered,
// rank-invariant inputs and the publication, itself identical on every rank.
func (c *Calibrator) bottleneck(ranks []RankSample) int {
	best := 0
	if c.published {
		m := float64(c.set.MaxNumTokens)
		cost := func(r RankSample) float64 { return c.pub.A*float64(r.N)/m + c.pub.C2*float64(r.S) }
		bc := cost(ranks[0])
		for i := 1; i < len(ranks); i++ {
			if v := cost(ranks[i]); v > bc {
				best, bc = i, v
			}
		}
		return best
	}
	for i := 1; i < len(ranks); i++ {
		if r, b := ranks[i], ranks[best]; r.S > b.S || (r.S == b.S && r.N > b.N) {
			best = i
		}
	}
	return best
}
