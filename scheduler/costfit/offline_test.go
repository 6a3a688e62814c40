package costfit

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// workedM is the M of the §8.4 worked example.
const workedM = 8192

// WorkedExampleText is the §8.3 report of the §8.4 worked example, figure
// for figure as the spec's table gives them.
const workedExampleText = `records: 40 ranks: 2 iterations: 20
monopoly spans: 1 samples: 19
slope: 8.620 us per KV token at N=8192 (c2 = 1.052e-06 ms per token*KV)
intercept: 1465.0 ms
kv_cost_offset: range [110470, 169954] recommended 140000
linearity [0, 200000): insufficient data
linearity [200000, 500000): 8.620 us/kv
linearity [500000, 1050000): 8.620 us/kv
kv_depth_threshold: p50 = 445056 recommended 445000
lockstep waste: mean 37.0% p90 37.9% over 15 iterations
predicted gain (saturated upper bound): p50 2.73x
export TLLM_V2_CTX_COST_KV_OFFSET=140000
export TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD=445000
`

// chunk is one record with a single context chunk of n tokens at depth kv.
func chunk(rank int, it int64, deviceMS float64, id uint64, kv, n int64) Record {
	return Record{Rank: rank, Iter: it, DeviceMS: deviceMS, NumCtxRequests: 1,
		CtxRequestIDs: []uint64{id}, CtxKVStart: []int64{kv}, CtxTokens: n,
		CtxCachedKVTokens: kv, CostS: float64(n) * (float64(kv) + float64(n)/2)}
}

// workedExample is the §8.4 input: rank 0 continues request "a" (id 1) from
// 400 000 by M per iteration; rank 1 starts a new request at depth 0 every
// iteration; both report the lockstep time of rank 0's chunk. kvOf lets a
// row perturb rank 0's depth.
func workedExample(iters int64, kvOf func(it int64) int64) []Record {
	if kvOf == nil {
		kvOf = func(it int64) int64 { return 400_000 + workedM*it }
	}
	var recs []Record
	for it := range iters {
		kv := kvOf(it)
		dev := 1465 + 0.00862*float64(kv)
		recs = append(recs, chunk(0, it, dev, 1, kv, workedM), chunk(1, it, dev, uint64(100+it), 0, workedM))
	}
	return recs
}

func format(t *testing.T, r *Result) string {
	t.Helper()
	var b strings.Builder
	require.NoError(t, r.Format(&b))
	return b.String()
}

func sampleIters(r *Result) []int64 {
	var out []int64
	for _, s := range r.Samples {
		out = append(out, s.Iter)
	}
	return out
}

func iterRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestOfflineFit(t *testing.T) {
	opt := DefaultOptions()
	t.Run("OF-01", func(t *testing.T) {
		r, err := Fit(workedExample(20, nil), opt)
		require.NoError(t, err)
		assert.Equal(t, workedExampleText, format(t, r))
		// The intermediate figures of the §8.4 table.
		require.Len(t, r.Spans, 1)
		assert.Equal(t, Span{ID: 0, Rank: 0, FirstIter: 0, LastIter: 18, Samples: 19, SlopeMS: r.SlopeMS}, r.Spans[0])
		assert.InDelta(t, 0.00862, r.SlopeMS, 1e-12)
		assert.InDelta(t, 1465.0, r.InterceptMS, 1e-6)
		assert.InDelta(t, 169953.6, r.OffsetHi, 0.05)
		assert.InDelta(t, 110469.8, r.OffsetLo, 0.05)
		assert.Equal(t, int64(140000), r.Offset)
		assert.False(t, r.Linearity[0].Sufficient)
		assert.InDelta(t, 8.620, r.Linearity[1].SlopeUS, 1e-9)
		assert.InDelta(t, 8.620, r.Linearity[2].SlopeUS, 1e-9)
		assert.Len(t, r.Depths, 30)
		assert.Equal(t, 445056.0, r.ThresholdRaw)
		assert.Equal(t, int64(445000), r.Threshold)
		assert.Equal(t, 15, r.WasteIterations)
		assert.InDelta(t, 0.370, r.WasteMean, 0.0005)
		assert.InDelta(t, 0.379, r.WasteP90, 0.0005)
		assert.InDelta(t, 2.73, r.GainP50, 0.005)
	})
	t.Run("OF-02", func(t *testing.T) {
		// Both ranks start a new request every iteration: nothing continues.
		var recs []Record
		for it := range int64(20) {
			recs = append(recs, chunk(0, it, 5000, uint64(it), 400_000, workedM), chunk(1, it, 5000, uint64(1000+it), 0, workedM))
		}
		_, err := Fit(recs, opt)
		require.ErrorIs(t, err, ErrNoSpan)
		assert.EqualError(t, err, "no monopoly span found (need at least one span of 6 iterations)")
	})
	t.Run("OF-03", func(t *testing.T) {
		// Four ranks; at iteration 7 only rank 0 reports a device time, so
		// T(7) is undefined (it needs 4 div 2 = 2 ranks) and the span breaks.
		var recs []Record
		for it := range int64(20) {
			kv := 400_000 + workedM*it
			dev := 1465 + 0.00862*float64(kv)
			peer := dev
			if it == 7 {
				peer = 0 // null
			}
			recs = append(recs, chunk(0, it, dev, 1, kv, workedM))
			for r := 1; r < 4; r++ {
				recs = append(recs, chunk(r, it, peer, uint64(100*r)+uint64(it), 0, workedM))
			}
		}
		res, err := Fit(recs, opt)
		require.NoError(t, err)
		assert.Equal(t, append(iterRange(0, 6), iterRange(8, 18)...), sampleIters(res))
		assert.Len(t, res.Spans, 2)
		// Two reporting ranks are enough.
		recs[7*4+1].DeviceMS = 1000
		res, err = Fit(recs, opt)
		require.NoError(t, err)
		assert.Equal(t, iterRange(0, 18), sampleIters(res))
	})
	t.Run("OF-04", func(t *testing.T) {
		// Iterations 0..5: rank 0 qualifies at 0..4 (5 iterations).
		_, err := Fit(workedExample(6, nil), opt)
		require.ErrorIs(t, err, ErrNoSpan)
		short := opt
		short.MinSpan = 5
		res, err := Fit(workedExample(6, nil), short)
		require.NoError(t, err, "the same run is kept with --min-span 5")
		assert.Equal(t, iterRange(0, 4), sampleIters(res))
	})
	t.Run("OF-05", func(t *testing.T) {
		// Rank 1 runs two requests with 600 000 cached in total (mean
		// 300 000): rank 0 at 400 000 ≤ 1.5 · 300 000 is not a monopoly; it
		// becomes one from iteration 7 (457 344 > 450 000).
		recs := workedExample(20, nil)
		for i := range recs {
			if r := &recs[i]; r.Rank == 1 {
				r.NumCtxRequests, r.CtxRequestIDs, r.CtxKVStart = 2, []uint64{7, 8}, []int64{300_000, 300_000}
				r.CtxCachedKVTokens = 600_000
			}
		}
		res, err := Fit(recs, opt)
		require.NoError(t, err)
		assert.Equal(t, iterRange(7, 18), sampleIters(res))
	})
	t.Run("OF-06", func(t *testing.T) {
		// Between iterations 10 and 11 request a grows by M − 64 only.
		kvOf := func(it int64) int64 {
			kv := 400_000 + workedM*it
			if it >= 11 {
				kv -= 64
			}
			return kv
		}
		res, err := Fit(workedExample(20, kvOf), opt)
		require.NoError(t, err)
		assert.Equal(t, append(iterRange(0, 9), iterRange(11, 18)...), sampleIters(res))
	})
	t.Run("OF-07", func(t *testing.T) {
		recs := workedExample(20, nil)
		rng := rand.New(rand.NewPCG(7, 11))
		for range 5 {
			shuffled := slices.Clone(recs)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			res, err := Fit(shuffled, opt)
			require.NoError(t, err)
			assert.Equal(t, workedExampleText, format(t, res))
		}
	})
	t.Run("OF-08", func(t *testing.T) {
		res, err := Fit(workedExample(20, nil), opt)
		require.NoError(t, err)
		for _, d := range res.Depths {
			assert.GreaterOrEqual(t, d.Iter, int64(5))
		}
		none := opt
		none.WarmupIters = 0
		res0, err := Fit(workedExample(20, nil), none)
		require.NoError(t, err)
		assert.Len(t, res0.Depths, 40)
		assert.Equal(t, 20, res0.WasteIterations)
		assert.NotEqual(t, res.GainP50, res0.GainP50, "the early (shallower) iterations change the gain")
		assert.NotEqual(t, res.ThresholdRaw, res0.ThresholdRaw)
		// The fit itself (spans, slope, offset) ignores the warm-up.
		assert.Equal(t, res.Samples, res0.Samples)
		assert.Equal(t, res.Offset, res0.Offset)
	})
	t.Run("OF-09", func(t *testing.T) {
		assert.Equal(t, 2.5, Median([]float64{1, 2, 3, 4}))
		assert.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}), "input order does not matter")
		assert.Equal(t, 3.0, Median([]float64{5, 1, 3}))
	})
	t.Run("OF-10", func(t *testing.T) {
		assert.Equal(t, int64(140000), Round1000(140211.7))
		assert.Equal(t, int64(141000), Round1000(140500))
		assert.Equal(t, int64(139000), Round1000(139499))
	})
}

// TestPercentileConvention pins §8.1's index rule (no interpolation).
func TestPercentileConvention(t *testing.T) {
	xs := []float64{10, 20, 30, 40}
	assert.Equal(t, 30.0, Percentile(xs, 50), "index floor(4·0.5) = 2")
	assert.Equal(t, 40.0, Percentile(xs, 100), "index min(3, 4)")
	assert.Equal(t, 10.0, Percentile(xs, 0))
	assert.Equal(t, 40.0, Percentile(xs, 90), "index floor(3.6) = 3")
}

// TestDuplicatesKeepLast: the same (rank, iter) twice keeps the record that
// came later in the input (the log may repeat a line after a restart).
func TestDuplicatesKeepLast(t *testing.T) {
	recs := workedExample(20, nil)
	// A stale line for rank 0's iteration 3 that would break its span.
	stale := chunk(0, 3, 5000, 2, 400_000+3*workedM, workedM)
	withDup := append([]Record{stale}, recs...)
	res, err := Fit(withDup, DefaultOptions())
	require.NoError(t, err)
	assert.Equal(t, workedExampleText, format(t, res))

	late := append(slices.Clone(recs), stale)
	res, err = Fit(late, DefaultOptions())
	require.NoError(t, err)
	assert.Equal(t, 40, res.Records)
	assert.Equal(t, iterRange(4, 18), sampleIters(res), "the later, stale record wins")
}

func TestFitErrors(t *testing.T) {
	bad := []func(*Options){
		func(o *Options) { o.MaxNumTokens = 0 },
		func(o *Options) { o.Percentile = 101 },
		func(o *Options) { o.MinSpan = 0 },
		func(o *Options) { o.WarmupIters = -1 },
	}
	for i, f := range bad {
		o := DefaultOptions()
		f(&o)
		_, err := Fit(workedExample(20, nil), o)
		assert.ErrorIs(t, err, ErrOptions, "case %d", i)
	}
	// A run whose time falls with depth has no usable model.
	recs := workedExample(20, nil)
	for i := range recs {
		recs[i].DeviceMS = 9000 - 0.001*float64(recs[i].Iter)
	}
	_, err := Fit(recs, DefaultOptions())
	require.ErrorIs(t, err, ErrNoFit)
	assert.False(t, errors.Is(err, ErrNoSpan))
	// All context work before the warm-up.
	o := DefaultOptions()
	o.WarmupIters = 100
	_, err = Fit(workedExample(20, nil), o)
	require.ErrorIs(t, err, ErrNoFit)
}

// TestFormatWithoutWasteIterations: when no iteration after the warm-up has
// context work on every rank, waste and gain print as n/a.
func TestFormatWithoutWasteIterations(t *testing.T) {
	recs := workedExample(20, nil)
	for i := range recs {
		if r := &recs[i]; r.Rank == 1 {
			r.NumCtxRequests, r.CtxRequestIDs, r.CtxKVStart, r.CtxTokens, r.CostS = 0, nil, nil, 0, 0
		}
	}
	res, err := Fit(recs, DefaultOptions())
	require.NoError(t, err)
	out := format(t, res)
	assert.Contains(t, out, "lockstep waste: mean n/a p90 n/a over 0 iterations\npredicted gain (saturated upper bound): p50 n/a\n")
	assert.Contains(t, out, "kv_depth_threshold: p50 = 502400 recommended 502000\n", "rank 0's depths only: element 7 of 15 is iteration 12")
}
