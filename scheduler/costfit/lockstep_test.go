package costfit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lcIterations is the length of every LC run (§10.3).
const lcIterations = 600

// fleetIteration draws one lockstep iteration of §10.3: every rank its own
// full-budget chunk, the measured time the noisy maximum of the ranks'
// costs, seen as the same wall time by every rank.
func (g *ocGen) fleetIteration(dp int) []RankSample {
	ranks := make([]RankSample, dp)
	var worst float64
	for r := range ranks {
		_, s := g.chunk()
		ranks[r] = RankSample{N: ocM, S: s, CtxTokens: ocM}
		worst = max(worst, g.a*float64(ranks[r].N)/ocM+g.c2*float64(s))
	}
	t := g.noisy(worst)
	for r := range ranks {
		ranks[r].WallMS = t
	}
	return ranks
}

// runFleet feeds lcIterations gathered vectors of dp ranks to a calibrator
// with the given correction and returns it.
func runFleet(t *testing.T, seed uint64, dp int, corrected bool) *Calibrator {
	t.Helper()
	s := ocSettings()
	s.LockstepCorrection = corrected
	c := mustNewCal(t, s)
	g := newOCGen(seed, ocA, ocC2)
	for it := range int64(lcIterations) {
		c.ObserveFleet(it, 0, g.fleetIteration(dp))
	}
	return c
}

func TestLockstepCorrection(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5}
	t.Run("LC-01", func(t *testing.T) {
		for _, seed := range seeds {
			pub, ok := runFleet(t, seed, 4, false).Published()
			if ok {
				assert.GreaterOrEqual(t, pub.Offset, int64(5*truthO), "seed %d: the biased offset", seed)
			}
		}
	})
	t.Run("LC-02", func(t *testing.T) {
		for _, seed := range seeds {
			pub, ok := runFleet(t, seed, 4, true).Published()
			require.True(t, ok, "seed %d", seed)
			assert.GreaterOrEqual(t, pub.Offset, int64(150_000), "seed %d", seed)
			assert.LessOrEqual(t, pub.Offset, int64(260_000), "seed %d", seed)
			assert.Greater(t, pub.Threshold, int64(250_000), "seed %d", seed)
			assert.Less(t, pub.Threshold, int64(350_000), "seed %d", seed)
		}
	})
	t.Run("LC-03", func(t *testing.T) {
		for _, seed := range seeds {
			pub, ok := runFleet(t, seed, 16, true).Published()
			require.True(t, ok, "seed %d", seed)
			assert.GreaterOrEqual(t, pub.Offset, int64(150_000), "seed %d", seed)
			assert.LessOrEqual(t, pub.Offset, int64(260_000), "seed %d", seed)
		}
	})
	t.Run("LC-04", func(t *testing.T) {
		for _, seed := range seeds {
			_, ok := runFleet(t, seed, 16, false).Published()
			assert.False(t, ok, "seed %d", seed)
		}
	})
	t.Run("LC-05", func(t *testing.T) {
		// dp 1: the corrected fleet path and the per-rank path see the same
		// (N, S, T), so every refit finds the same c2 and A.
		fleet, own := mustNewCal(t, ocSettings()), mustNewCal(t, ocSettings())
		g := newOCGen(11, ocA, ocC2)
		refits := 0
		for it := range int64(lcIterations) {
			v := g.fleetIteration(1)
			fleet.ObserveFleet(it, 0, v)
			own.ObserveChunk(v[0].S/v[0].CtxTokens, v[0].CtxTokens)
			own.ObserveIteration(v[0].N, v[0].S, v[0].WallMS)
			own.MaybeRefresh(it)
			rf, okf := fleet.LastRefresh()
			ro, oko := own.LastRefresh()
			require.Equal(t, okf, oko)
			if okf && rf.Observations == it+1 {
				refits++
				assert.Equal(t, math.Float64bits(ro.C2), math.Float64bits(rf.C2), "iteration %d", it)
				assert.Equal(t, math.Float64bits(ro.A), math.Float64bits(rf.A), "iteration %d", it)
			}
		}
		assert.Equal(t, lcIterations/64, refits)
		pf, _ := fleet.Published()
		po, _ := own.Published()
		assert.Equal(t, po, pf)
	})
	t.Run("LC-06", func(t *testing.T) {
		// Four ranks, each with its own calibrator, fed the same gathered
		// vectors: every return value is bit-identical, every iteration.
		const dp = 4
		cals := make([]*Calibrator, dp)
		for r := range cals {
			cals[r] = mustNewCal(t, ocSettings())
		}
		g := newOCGen(12, ocA, ocC2)
		publications := 0
		for it := range int64(lcIterations) {
			v := g.fleetIteration(dp)
			p0, ch0 := cals[0].ObserveFleet(it, 0, v)
			for r := 1; r < dp; r++ {
				p, ch := cals[r].ObserveFleet(it, r, v)
				require.Equal(t, ch0, ch, "rank %d iteration %d", r, it)
				require.Equal(t, bits(p0), bits(p), "rank %d iteration %d", r, it)
			}
			if ch0 {
				publications++
			}
		}
		assert.Positive(t, publications)
	})
	t.Run("LC-07", func(t *testing.T) {
		c := mustNewCal(t, ocSettings())
		v := []RankSample{{N: 100, S: 5}, {N: 100, S: 9}, {N: 100, S: 9}, {N: 100, S: 2}}
		assert.Equal(t, 1, c.bottleneck(v), "largest S, tie to the lowest rank")
		v[2].N = 101
		assert.Equal(t, 2, c.bottleneck(v), "equal S: the larger N")
	})
	t.Run("LC-08", func(t *testing.T) {
		s := ocSettings()
		c := mustNewCal(t, s)
		c.pub, c.published = Publication{A: 1000, C2: 1e-6}, true
		v := []RankSample{{N: 8192, S: 1e8}, {N: 16, S: 2e8}}
		assert.Equal(t, 0, c.bottleneck(v), "costs 1 100 and ≈ 202")
		// Before any publication the larger S would have won.
		c.published = false
		assert.Equal(t, 1, c.bottleneck(v))
	})
}

// bits is a publication with its floats as raw bits, for bit-identity.
func bits(p Publication) [7]uint64 {
	return [7]uint64{uint64(p.Offset), uint64(p.Threshold), uint64(p.Budget), math.Float64bits(p.A),
		math.Float64bits(p.C2), uint64(p.Iteration), uint64(p.Observations)}
}

// TestObserveFleetMedianWall: T is the median of the gathered wall times
// (mean of the middle two for an even count), not this rank's own time.
func TestObserveFleetMedianWall(t *testing.T) {
	c := mustNewCal(t, ocSettings())
	c.ObserveFleet(0, 3, []RankSample{{N: 10, S: 1, WallMS: 4}, {N: 10, S: 9, WallMS: 1}, {N: 10, S: 2, WallMS: 100}, {N: 10, S: 3, WallMS: 2}})
	require.Equal(t, int64(1), c.Observations())
	assert.Equal(t, []any{int64(10), int64(9), 3.0}, []any{c.n[0], c.s[0], c.t[0]}, "rank 1's features, median wall (2+4)/2")
	// Midpoint depths S / ctx weighted by ctx tokens.
	c.ObserveFleet(1, 0, []RankSample{{N: 10, S: 40 * BucketTokens * 5, CtxTokens: 5, WallMS: 1}, {N: 3, WallMS: 1}})
	assert.Equal(t, int64(5), c.hist[40])
}

// TestObserveFleetAllocationFree: between refits the per-iteration call
// allocates nothing once its scratch has grown (the executor calls it every
// iteration on every rank).
func TestObserveFleetAllocationFree(t *testing.T) {
	s := ocSettings()
	s.RefreshInterval = 1 << 30
	c := mustNewCal(t, s)
	v := newOCGen(13, ocA, ocC2).fleetIteration(8)
	c.ObserveFleet(0, 0, v)
	assert.Zero(t, testing.AllocsPerRun(100, func() { c.ObserveFleet(1, 0, v) }))
}
