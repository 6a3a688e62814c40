package costfit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Defaults of the offline fit's options (router-and-calibration.md §8.1).
const (
	DefaultMaxNumTokens = 8192
	DefaultPercentile   = 50
	DefaultMinSpan      = 6
	DefaultWarmupIters  = 5
)

// Depth bands of the linearity check (§8.2 step 7), in KV tokens: [lo, hi).
var linearityBands = [...][2]int64{{0, 200_000}, {200_000, 500_000}, {500_000, 1_050_000}}

// deepSampleKV is the depth above which samples fix the intercept (§8.2 step
// 5): deep chunks are where the per-token term dominates and the fixed part
// of the iteration is best isolated.
const deepSampleKV = 200_000

// ErrNoSpan is wrapped by Fit when no rank ever held a monopoly span; the
// command exits 2 on it (§8.3). Its full message is the spec's:
// "no monopoly span found (need at least one span of N iterations)".
var ErrNoSpan = errors.New("no monopoly span found")

// ErrNoFit is wrapped by Fit when spans exist but the data cannot give a
// usable model (a slope or intercept that is not positive, no context work
// after the warm-up); the message says which figure failed.
var ErrNoFit = errors.New("no usable fit")

// ErrOptions is wrapped by Fit for options out of their allowed ranges.
var ErrOptions = errors.New("invalid calibration option")

// Options are the offline fit's settings (§8.1).
type Options struct {
	// MaxNumTokens is M, the token budget of the logged run (> 0).
	MaxNumTokens int64 `json:"max_num_tokens"`
	// Percentile is p of the depth threshold, in [0, 100].
	Percentile float64 `json:"kv_depth_threshold_percentile"`
	// MinSpan is the shortest run of monopoly iterations kept (≥ 1).
	MinSpan int `json:"min_span"`
	// WarmupIters excludes iterations below it from the threshold, waste and
	// gain (≥ 0).
	WarmupIters int64 `json:"warmup_iters"`
}

// DefaultOptions returns the §8.1 defaults.
func DefaultOptions() Options {
	return Options{MaxNumTokens: DefaultMaxNumTokens, Percentile: DefaultPercentile,
		MinSpan: DefaultMinSpan, WarmupIters: DefaultWarmupIters}
}

func (o Options) validate() error {
	switch {
	case o.MaxNumTokens <= 0:
		return fmt.Errorf("%w: max-num-tokens %d must be > 0 (the M of the logged run)", ErrOptions, o.MaxNumTokens)
	case !(o.Percentile >= 0 && o.Percentile <= 100):
		return fmt.Errorf("%w: kv-depth-threshold-percentile %v must lie in [0, 100]", ErrOptions, o.Percentile)
	case o.MinSpan < 1:
		return fmt.Errorf("%w: min-span %d must be ≥ 1", ErrOptions, o.MinSpan)
	case o.WarmupIters < 0:
		return fmt.Errorf("%w: warmup-iters %d must be ≥ 0", ErrOptions, o.WarmupIters)
	}
	return nil
}

// Record is what the fit reads from one iteration-log line (executor.md
// §13.2); the field names follow the JSON keys.
type Record struct {
	Rank int   // rank
	Iter int64 // iter
	// DeviceMS is device_ms; 0 (or any value ≤ 0) stands for null.
	DeviceMS          float64
	NumCtxRequests    int      // num_ctx_requests
	CtxRequestIDs     []uint64 // ctx_request_ids, batch order
	CtxKVStart        []int64  // ctx_kv_start, parallel to CtxRequestIDs
	CtxTokens         int64    // ctx_tokens (Σ chunk sizes)
	CtxCachedKVTokens int64    // ctx_cached_kv_tokens (Σ ctx_kv_start)
	CostS             float64  // cost_s = Σ n · (kv + n/2)
}

// single reports the id and start depth of the record's only context
// request; ok is false unless it has exactly one.
func (r *Record) single() (id uint64, kv int64, ok bool) {
	if r.NumCtxRequests != 1 || len(r.CtxRequestIDs) != 1 || len(r.CtxKVStart) != 1 {
		return 0, 0, false
	}
	return r.CtxRequestIDs[0], r.CtxKVStart[0], true
}

// Span is one kept monopoly span (§8.2 step 3): consecutive qualifying
// iterations of one rank.
type Span struct {
	ID        int     `json:"id"` // index into Result.Spans; Sample.Span refers to it
	Rank      int     `json:"rank"`
	FirstIter int64   `json:"first_iter"`
	LastIter  int64   `json:"last_iter"`
	Samples   int     `json:"samples"`
	SlopeMS   float64 `json:"slope_ms_per_kv"` // the span's Theil–Sen slope
}

// Sample is one monopoly sample (§8.2 step 2): the lockstep iteration time
// attributed to one deep rank's single full-budget chunk.
type Sample struct {
	Span int     `json:"span"`
	Rank int     `json:"rank"`
	Iter int64   `json:"iter"`
	KV   int64   `json:"kv"`   // the chunk's ctx_kv_start
	TMS  float64 `json:"t_ms"` // T(it), the median device time over ranks
}

// Band is one depth band of the linearity check (§8.2 step 7).
type Band struct {
	Lo int64 `json:"lo"` // inclusive, KV tokens
	Hi int64 `json:"hi"` // exclusive
	// Sufficient is false when no sub-span of MinSpan samples lies in the
	// band ("insufficient data"); SlopeUS is then 0.
	Sufficient bool    `json:"sufficient"`
	SlopeUS    float64 `json:"slope_us_per_kv"`
}

// DepthSample is one record's token-weighted midpoint depth (§8.2 step 8).
type DepthSample struct {
	Rank   int     `json:"rank"`
	Iter   int64   `json:"iter"`
	Depth  float64 `json:"depth"`  // cost_s / ctx_tokens
	Tokens int64   `json:"tokens"` // ctx_tokens, the weight in the plot's histogram
}

// Result carries every figure of one offline fit. Times are in ms, depths
// in KV tokens.
type Result struct {
	Options    Options `json:"options"`
	Records    int     `json:"records"` // after de-duplication
	Ranks      int     `json:"ranks"`
	Iterations int     `json:"iterations"` // distinct iteration numbers

	Spans   []Span   `json:"spans"`
	Samples []Sample `json:"samples"` // of the kept spans, in (rank, iter) order

	SlopeMS     float64 `json:"slope_ms_per_kv"` // ms per KV token at N = M
	C2          float64 `json:"c2"`              // ms per token·KV: SlopeMS / M
	InterceptMS float64 `json:"intercept_ms"`    // A

	OffsetLo float64 `json:"offset_lo"` // 0.65 · OffsetHi
	OffsetHi float64 `json:"offset_hi"` // A / slope
	Offset   int64   `json:"kv_cost_offset"`

	Linearity []Band `json:"linearity"`

	ThresholdRaw float64       `json:"threshold_raw"` // p-th percentile of Depths
	Threshold    int64         `json:"kv_depth_threshold"`
	Depths       []DepthSample `json:"depths"`

	// Waste and gain over WasteIterations (iterations ≥ warm-up where every
	// rank has context work); all 0 when there is none.
	WasteMean       float64 `json:"waste_mean"` // fraction, not percent
	WasteP90        float64 `json:"waste_p90"`
	WasteIterations int     `json:"waste_iterations"`
	GainP50         float64 `json:"gain_p50"`
}

// Fit runs the offline calibration of §8.2 over recs (any order; the same
// (rank, iter) twice keeps the later record in recs). It does not modify
// recs. Errors wrap ErrOptions, ErrNoSpan (exit 2) or ErrNoFit.
func Fit(recs []Record, opt Options) (*Result, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	recs = sortDedupe(recs)
	res := &Result{Options: opt, Records: len(recs)}
	f := newFleet(recs)
	res.Ranks, res.Iterations = len(f.ranks), len(f.iters)

	res.Spans, res.Samples = monopolySpans(recs, f, opt)
	if len(res.Spans) == 0 {
		return nil, fmt.Errorf("%w (need at least one span of %d iterations)", ErrNoSpan, opt.MinSpan)
	}
	slopes := make([]float64, len(res.Spans))
	for i, s := range res.Spans {
		slopes[i] = s.SlopeMS
	}
	res.SlopeMS = Median(slopes)
	if !(res.SlopeMS > 0) {
		return nil, fmt.Errorf("%w: the Theil–Sen slope over %d spans is %.3g ms per KV token: the iteration time does not grow with the KV depth "+
			"(do the logs hold every rank, with the fleet's iteration time, fleet_device_ms? is attention negligible at these depths?)",
			ErrNoFit, len(res.Spans), res.SlopeMS)
	}
	res.C2 = res.SlopeMS / float64(opt.MaxNumTokens)
	res.InterceptMS = intercept(res.Samples, res.SlopeMS)
	if !(res.InterceptMS > 0) {
		return nil, fmt.Errorf("%w: the intercept A is %.3g ms; a full-budget iteration must have a positive fixed cost (check --max-num-tokens against the run's M)",
			ErrNoFit, res.InterceptMS)
	}
	res.OffsetHi = res.InterceptMS / res.SlopeMS
	res.OffsetLo = 0.65 * res.OffsetHi
	res.Offset = Round1000((res.OffsetLo + res.OffsetHi) / 2)
	res.Linearity = linearity(res.Samples, opt.MinSpan)

	res.Depths = depths(recs, opt.WarmupIters)
	if len(res.Depths) == 0 {
		return nil, fmt.Errorf("%w: no record at iteration ≥ %d has context tokens, so there is no depth distribution for the threshold (lower --warmup-iters?)",
			ErrNoFit, opt.WarmupIters)
	}
	ds := make([]float64, len(res.Depths))
	for i, d := range res.Depths {
		ds[i] = d.Depth
	}
	res.ThresholdRaw = Percentile(ds, opt.Percentile)
	res.Threshold = Round1000(res.ThresholdRaw)
	wasteAndGain(res, recs, f)
	return res, nil
}

// sortDedupe returns the records sorted by (rank, iter), keeping the last
// occurrence of a duplicate key (a stable sort keeps input order among
// equal keys, so the last of each run is the latest in the input).
func sortDedupe(in []Record) []Record {
	s := slices.Clone(in)
	slices.SortStableFunc(s, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Iter, b.Iter))
	})
	out := s[:0]
	for i := range s {
		if i+1 < len(s) && s[i+1].Rank == s[i].Rank && s[i+1].Iter == s[i].Iter {
			continue
		}
		out = append(out, s[i])
	}
	return out
}

// fleet indexes sorted records by iteration. The maps are only looked up;
// every loop that decides something walks the sorted slices.
type fleet struct {
	ranks  []int             // distinct ranks, ascending
	iters  []int64           // distinct iterations, ascending
	byIter map[int64][]int   // record indices of an iteration, ascending rank
	tIter  map[int64]float64 // T(it) where defined (§8.2 step 1)
}

func newFleet(recs []Record) *fleet {
	f := &fleet{byIter: map[int64][]int{}, tIter: map[int64]float64{}}
	for i, r := range recs {
		if len(f.ranks) == 0 || f.ranks[len(f.ranks)-1] != r.Rank {
			f.ranks = append(f.ranks, r.Rank)
		}
		if _, seen := f.byIter[r.Iter]; !seen {
			f.iters = append(f.iters, r.Iter)
		}
		f.byIter[r.Iter] = append(f.byIter[r.Iter], i)
	}
	slices.Sort(f.iters)
	// Step 1: T(it) needs max(1, R div 2) reporting ranks, so that one
	// straggling or idle rank cannot define the lockstep time alone.
	need := max(1, len(f.ranks)/2)
	for _, it := range f.iters {
		var ms []float64
		for _, i := range f.byIter[it] {
			if d := recs[i].DeviceMS; d > 0 && !math.IsInf(d, 0) {
				ms = append(ms, d)
			}
		}
		if len(ms) >= need {
			f.tIter[it] = Median(ms)
		}
	}
	return f
}

// qualifies applies §8.2 step 2 to record i: one full-budget chunk whose
// request continues by exactly M at the next iteration, a defined T(it),
// and a depth above 1.5 × every other rank's mean cached depth.
func qualifies(recs []Record, i int, f *fleet, m int64) bool {
	r := &recs[i]
	id, kv, ok := r.single()
	if !ok || r.CtxTokens != m {
		return false
	}
	if i+1 >= len(recs) || recs[i+1].Rank != r.Rank || recs[i+1].Iter != r.Iter+1 {
		return false
	}
	nid, nkv, ok := recs[i+1].single()
	if !ok || nid != id || nkv != kv+m {
		return false
	}
	if _, ok := f.tIter[r.Iter]; !ok {
		return false
	}
	var peer float64
	for _, j := range f.byIter[r.Iter] {
		if o := &recs[j]; o.Rank != r.Rank {
			peer = max(peer, float64(o.CtxCachedKVTokens)/float64(max(o.NumCtxRequests, 1)))
		}
	}
	return float64(kv) > 1.5*peer
}

// monopolySpans finds the qualifying runs (steps 2–4), drops those shorter
// than MinSpan or without a Theil–Sen pair, and numbers the rest in (rank,
// first iteration) order.
func monopolySpans(recs []Record, f *fleet, opt Options) ([]Span, []Sample) {
	var spans []Span
	var samples []Sample
	var run []Sample
	flush := func() {
		if len(run) >= opt.MinSpan {
			xs, ys := kvAndT(run)
			if slope, ok := theilSen(xs, ys); ok {
				id := len(spans)
				spans = append(spans, Span{ID: id, Rank: run[0].Rank, FirstIter: run[0].Iter,
					LastIter: run[len(run)-1].Iter, Samples: len(run), SlopeMS: slope})
				for _, s := range run {
					s.Span = id
					samples = append(samples, s)
				}
			}
		}
		run = run[:0]
	}
	for i := range recs {
		r := &recs[i]
		if !qualifies(recs, i, f, opt.MaxNumTokens) {
			flush()
			continue
		}
		if n := len(run); n > 0 && (run[n-1].Rank != r.Rank || run[n-1].Iter+1 != r.Iter) {
			flush()
		}
		run = append(run, Sample{Rank: r.Rank, Iter: r.Iter, KV: r.CtxKVStart[0], TMS: f.tIter[r.Iter]})
	}
	flush()
	return spans, samples
}

func kvAndT(run []Sample) (xs, ys []float64) {
	xs, ys = make([]float64, len(run)), make([]float64, len(run))
	for i, s := range run {
		xs[i], ys[i] = float64(s.KV), s.TMS
	}
	return xs, ys
}

// intercept is step 5: the median residual T − slope·kv over the deep
// samples, or over all samples when none is deep.
func intercept(samples []Sample, slope float64) float64 {
	var deep, all []float64
	for _, s := range samples {
		r := s.TMS - slope*float64(s.KV)
		all = append(all, r)
		if s.KV > deepSampleKV {
			deep = append(deep, r)
		}
	}
	if len(deep) > 0 {
		return Median(deep)
	}
	return Median(all)
}

// linearity is step 7: per band, the samples of each span inside the band
// form sub-spans (runs of consecutive iterations of at least minSpan); the
// band's slope is the median of their Theil–Sen slopes, in µs per KV token.
func linearity(samples []Sample, minSpan int) []Band {
	out := make([]Band, len(linearityBands))
	for b, lim := range linearityBands {
		out[b] = Band{Lo: lim[0], Hi: lim[1]}
		var slopes []float64
		var run []Sample
		flush := func() {
			if len(run) >= minSpan {
				if s, ok := theilSen(kvAndT(run)); ok {
					slopes = append(slopes, s)
				}
			}
			run = run[:0]
		}
		for _, s := range samples {
			if s.KV < lim[0] || s.KV >= lim[1] {
				flush()
				continue
			}
			if n := len(run); n > 0 && (run[n-1].Span != s.Span || run[n-1].Iter+1 != s.Iter) {
				flush()
			}
			run = append(run, s)
		}
		flush()
		if len(slopes) > 0 {
			out[b].Sufficient, out[b].SlopeUS = true, 1000*Median(slopes)
		}
	}
	return out
}

// depths is step 8's population: every record at or after the warm-up with
// context tokens, as its token-weighted midpoint depth.
func depths(recs []Record, warmup int64) []DepthSample {
	var out []DepthSample
	for _, r := range recs {
		if r.Iter >= warmup && r.CtxTokens > 0 {
			out = append(out, DepthSample{Rank: r.Rank, Iter: r.Iter, Depth: r.CostS / float64(r.CtxTokens), Tokens: r.CtxTokens})
		}
	}
	return out
}

// wasteAndGain are steps 9 and 10 over the iterations ≥ warm-up where every
// rank of the logs has context work.
func wasteAndGain(res *Result, recs []Record, f *fleet) {
	m := float64(res.Options.MaxNumTokens)
	o := float64(res.Offset)
	var wastes, gains []float64
	for _, it := range f.iters {
		idx := f.byIter[it]
		if it < res.Options.WarmupIters || len(idx) != len(f.ranks) {
			continue
		}
		busy := true
		for _, i := range idx {
			busy = busy && recs[i].CtxTokens > 0
		}
		if !busy {
			continue
		}
		var sumCost, maxCost, sumInv, maxDepth float64
		for _, i := range idx {
			r := &recs[i]
			c := res.InterceptMS*float64(r.CtxTokens)/m + res.C2*r.CostS
			sumCost += c
			maxCost = max(maxCost, c)
			d := r.CostS / float64(r.CtxTokens)
			sumInv += 1 / (o + d)
			maxDepth = max(maxDepth, d)
		}
		n := float64(len(idx))
		wastes = append(wastes, 1-(sumCost/n)/maxCost)
		gains = append(gains, sumInv/(n/(o+maxDepth)))
	}
	res.WasteIterations = len(wastes)
	if len(wastes) == 0 {
		return
	}
	var sum float64
	for _, w := range wastes {
		sum += w
	}
	res.WasteMean = sum / float64(len(wastes))
	res.WasteP90 = Percentile(wastes, 90)
	res.GainP50 = Percentile(gains, 50)
}
