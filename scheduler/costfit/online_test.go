package costfit

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The OC generator of router-and-calibration.md §9.4: full-budget
// iterations (N = M) of one chunk at a depth uniform in [0, 600 000],
// T = a + c2·S with noise × U[0.98, 1.02] and 3 % outliers × 10.
const (
	ocM       = 8192
	ocA       = 1638.4 // ms; with ocC2 the true offset is 200 000
	ocC2      = 1e-6
	ocMaxKV   = 600_000
	truthO    = 200_000
	ocOutlier = 0.03
)

// ocGen draws the synthetic iterations of §9.4 and §10.3 from a seeded PCG
// (randomness lives in tests only; the package takes seeds as data).
type ocGen struct {
	rng   *rand.Rand
	a, c2 float64
}

func newOCGen(seed uint64, a, c2 float64) *ocGen {
	return &ocGen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), a: a, c2: c2}
}

// chunk draws one full-budget chunk: its depth and S = M·(kv + M/2).
func (g *ocGen) chunk() (kv, s int64) {
	kv = g.rng.Int64N(ocMaxKV + 1)
	return kv, ocM * (kv + ocM/2)
}

// noisy applies the measurement noise and the occasional outlier.
func (g *ocGen) noisy(t float64) float64 {
	t *= 0.98 + 0.04*g.rng.Float64()
	if g.rng.Float64() < ocOutlier {
		t *= 10
	}
	return t
}

// ocSettings are the §9.4 settings (other settings at their defaults).
func ocSettings() Settings {
	s := DefaultSettings(ocM)
	s.Percentile, s.MinSamples, s.Window, s.RefreshInterval = 50, 64, 512, 64
	return s
}

func mustNewCal(t *testing.T, s Settings) *Calibrator {
	t.Helper()
	c, err := New(s)
	require.NoError(t, err)
	return c
}

// feedOC runs iters synthetic iterations through the per-rank path (one
// chunk observed per iteration, then the iteration, then a refresh).
func feedOC(c *Calibrator, g *ocGen, iters int) {
	for range iters {
		kv, s := g.chunk()
		c.ObserveChunk(kv, ocM)
		c.ObserveIteration(ocM, s, g.noisy(g.a+g.c2*float64(s)))
		c.MaybeRefresh(c.Observations())
	}
}

func TestOnlineCalibrator(t *testing.T) {
	t.Run("OC-01", func(t *testing.T) {
		for seed := range uint64(5) {
			c := mustNewCal(t, ocSettings())
			feedOC(c, newOCGen(seed, ocA, ocC2), 600)
			pub, ok := c.Published()
			require.True(t, ok, "seed %d: %+v", seed, c.last)
			assert.Greater(t, pub.Offset, int64(100_000), "seed %d", seed)
			assert.Less(t, pub.Offset, int64(400_000), "seed %d", seed)
			assert.Greater(t, pub.Threshold, int64(250_000), "seed %d", seed)
			assert.Less(t, pub.Threshold, int64(350_000), "seed %d", seed)
			assert.Equal(t, (pub.Offset+pub.Threshold)*ocM, pub.Budget)
		}
	})
	t.Run("OC-02", func(t *testing.T) {
		for seed := range uint64(5) {
			c := mustNewCal(t, ocSettings())
			feedOC(c, newOCGen(seed, ocA, 0), 600)
			_, ok := c.Published()
			assert.False(t, ok, "seed %d: a linear workload has no attention term: %+v", seed, c.last)
		}
	})
	t.Run("OC-03", func(t *testing.T) {
		s := ocSettings()
		s.MinSamples = 256
		c := mustNewCal(t, s)
		feedOC(c, newOCGen(1, ocA, ocC2), 100)
		_, ok := c.Published()
		assert.False(t, ok)
		r, _ := c.LastRefresh()
		assert.Contains(t, r.Reason, "need min_samples 256")
	})
	t.Run("OC-04", func(t *testing.T) {
		for _, hyst := range []float64{DefaultHysteresis, 0} {
			s := ocSettings()
			s.Hysteresis = hyst
			c := mustNewCal(t, s)
			feedOC(c, newOCGen(1, ocA, ocC2), 300)
			first, ok := c.Published()
			require.True(t, ok)
			feedOC(c, newOCGen(2, ocA, ocC2), 300)
			second, _ := c.Published()
			assert.InEpsilon(t, float64(first.Budget), float64(second.Budget), 0.15, "hysteresis %v", hyst)
		}
	})
	t.Run("OC-05", func(t *testing.T) {
		s := ocSettings()
		s.Percentile = 25
		c := mustNewCal(t, s)
		for _, kv := range []int64{0, 100_000, 200_000, 300_000} {
			c.ObserveChunk(kv, 1000)
		}
		d, ok := c.threshold()
		require.True(t, ok)
		assert.Equal(t, int64(8192), d, "bucket 0's centre holds the first 25 %")
		// Through a whole fit: iterations only, no further chunks.
		g := newOCGen(3, ocA, ocC2)
		for range 64 {
			_, sv := g.chunk()
			c.ObserveIteration(ocM, sv, g.noisy(ocA+ocC2*float64(sv)))
		}
		pub, changed := c.MaybeRefresh(64)
		require.True(t, changed, "%+v", c.last)
		assert.Equal(t, int64(8192), pub.Threshold)
	})
	t.Run("OC-06", func(t *testing.T) {
		c := mustNewCal(t, ocSettings())
		assert.False(t, c.ObserveIteration(0, 100, 5))
		assert.False(t, c.ObserveIteration(ocM, 100, 0))
		assert.False(t, c.ObserveIteration(-1, 100, 5))
		assert.False(t, c.ObserveIteration(ocM, 100, -3))
		assert.False(t, c.ObserveIteration(ocM, 100, math.NaN()))
		assert.False(t, c.ObserveIteration(ocM, 100, math.Inf(1)))
		assert.Zero(t, c.Observations())
		assert.True(t, c.ObserveIteration(ocM, 0, 5), "S = 0 is kept (the fit drops it)")
		assert.Equal(t, int64(1), c.Observations())
	})
	t.Run("OC-07", func(t *testing.T) {
		c := mustNewCal(t, ocSettings())
		g := newOCGen(4, ocA, ocC2)
		feedOC(c, g, 64)
		r, ok := c.LastRefresh()
		require.True(t, ok)
		require.Equal(t, int64(64), r.Observations)
		for i := range 63 {
			feedOC(c, g, 1)
			r, _ = c.LastRefresh()
			assert.Equal(t, int64(64), r.Observations, "after %d more", i+1)
		}
		// Ignored observations do not trigger a second refit at a multiple.
		c.ObserveIteration(0, 0, 0)
		c.MaybeRefresh(0)
		r, _ = c.LastRefresh()
		assert.Equal(t, int64(64), r.Observations)
		feedOC(c, g, 1)
		r, _ = c.LastRefresh()
		assert.Equal(t, int64(128), r.Observations)
	})
	t.Run("OC-08", func(t *testing.T) {
		// a 100 × larger: the fit's offset is about 20 000 000.
		c := mustNewCal(t, ocSettings())
		feedOC(c, newOCGen(5, 100*ocA, ocC2), 600)
		_, ok := c.Published()
		assert.False(t, ok)
		r, _ := c.LastRefresh()
		assert.InEpsilon(t, 2e7, r.Offset, 0.2)
		assert.Contains(t, r.Reason, "outside")
	})
	t.Run("OC-09", func(t *testing.T) {
		c := mustNewCal(t, ocSettings())
		c.StartPass(0, 0)
		c.PassPlanned(100, 1000)
		assert.Zero(t, c.Observations(), "the first pass observes nothing")
		c.StartPass(1, 40)
		c.PassPlanned(200, 5000)
		require.Equal(t, int64(1), c.Observations())
		assert.Equal(t, []any{int64(100), int64(1000), 40.0}, []any{c.n[0], c.s[0], c.t[0]})
		c.StartPass(2, 95)
		require.Equal(t, int64(2), c.Observations())
		assert.Equal(t, []any{int64(200), int64(5000), 55.0}, []any{c.n[1], c.s[1], c.t[1]})
	})
	t.Run("OC-10", func(t *testing.T) {
		// Before the first publication there is nothing to install: the
		// wiring leaves the scheduler without a cap (the scheduler's own
		// EC-22 checks that CostAuto has no cap until PublishCost).
		c := mustNewCal(t, ocSettings())
		feedOC(c, newOCGen(6, ocA, ocC2), 63)
		pub, ok := c.Published()
		assert.False(t, ok)
		assert.Equal(t, Publication{}, pub)
	})
}

// TestHysteresis: a refit that moves the budget by less than the hysteresis
// keeps the published values; a larger move replaces them.
func TestHysteresis(t *testing.T) {
	s := ocSettings()
	s.Hysteresis = 0.5
	c := mustNewCal(t, s)
	feedOC(c, newOCGen(7, ocA, ocC2), 64)
	first, ok := c.Published()
	require.True(t, ok)
	feedOC(c, newOCGen(8, ocA, ocC2), 64)
	kept, _ := c.Published()
	assert.Equal(t, first, kept)
	r, _ := c.LastRefresh()
	assert.Contains(t, r.Reason, "hysteresis")
	assert.NotEqual(t, first.Budget, int64(r.Budget), "the refit itself moved")

	// Twice the fixed cost doubles the offset: a 50 %+ move is published.
	feedOC(c, newOCGen(9, 3*ocA, ocC2), 512)
	moved, _ := c.Published()
	assert.Greater(t, float64(moved.Budget), 1.5*float64(first.Budget))
}

func TestSettingsValidation(t *testing.T) {
	bad := []func(*Settings){
		func(s *Settings) { s.MaxNumTokens = 0 },
		func(s *Settings) { s.Percentile = -1 },
		func(s *Settings) { s.MinSamples = 1 },
		func(s *Settings) { s.Window = s.MinSamples - 1 },
		func(s *Settings) { s.RefreshInterval = 0 },
		func(s *Settings) { s.Hysteresis = math.NaN() },
		func(s *Settings) { s.OffsetMin = 0 },
		func(s *Settings) { s.OffsetMax = s.OffsetMin / 2 },
	}
	for i, f := range bad {
		s := DefaultSettings(ocM)
		f(&s)
		_, err := New(s)
		assert.ErrorIs(t, err, ErrSettings, "case %d", i)
	}
	_, err := New(DefaultSettings(ocM))
	assert.NoError(t, err)
}
