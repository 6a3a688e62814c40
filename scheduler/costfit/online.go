package costfit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Histogram geometry of the online threshold (router-and-calibration.md
// §9.3): 64 buckets of 16 384 KV tokens; deeper chunks fall in the last.
const (
	HistogramBuckets = 64
	BucketTokens     = 16384
)

// Defaults of the online calibrator's settings (§9.1).
const (
	DefaultOnlinePercentile = 25
	DefaultMinSamples       = 256
	DefaultWindow           = 2048
	DefaultRefreshInterval  = 256
	DefaultHysteresis       = 0.1
	DefaultOffsetMin        = 1_000
	DefaultOffsetMax        = 10_000_000
)

// ErrSettings is wrapped by New for settings out of their allowed ranges.
var ErrSettings = errors.New("invalid ctx_cost setting")

// Settings configure the online calibrator (§9.1; YAML scheduler.ctx_cost).
type Settings struct {
	// MaxNumTokens is M, the scheduler's token budget (> 0); the model is
	// normalised to full-budget iterations.
	MaxNumTokens int64
	// Percentile of the token-weighted depth histogram that becomes D, in
	// [0, 100].
	Percentile float64
	// MinSamples is the least number of windowed samples a fit needs (≥ 2).
	MinSamples int
	// Window is the ring buffer's capacity in samples (≥ MinSamples).
	Window int
	// RefreshInterval: a refit happens when the observation count reaches a
	// multiple of it (≥ 1).
	RefreshInterval int
	// Hysteresis keeps a publication whose budget a refit moves by less than
	// this fraction of it (≥ 0).
	Hysteresis float64
	// OffsetMin and OffsetMax bound a publishable O (0 < min ≤ max).
	OffsetMin, OffsetMax float64
	// LockstepCorrection selects §10's fit against the fleet's bottleneck
	// rank in ObserveFleet; off, ObserveFleet uses the caller's own rank
	// only (§10.1's biased calibrator, kept for comparison and dp 1).
	LockstepCorrection bool
}

// DefaultSettings returns the §9.1 defaults for a scheduler budget of m
// tokens, lockstep correction on.
func DefaultSettings(m int64) Settings {
	return Settings{MaxNumTokens: m, Percentile: DefaultOnlinePercentile, MinSamples: DefaultMinSamples,
		Window: DefaultWindow, RefreshInterval: DefaultRefreshInterval, Hysteresis: DefaultHysteresis,
		OffsetMin: DefaultOffsetMin, OffsetMax: DefaultOffsetMax, LockstepCorrection: true}
}

func (s Settings) validate() error {
	bad := func(name string, v any, allowed string) error {
		return fmt.Errorf("%w: %s = %v (allowed: %s)", ErrSettings, name, v, allowed)
	}
	switch {
	case s.MaxNumTokens <= 0:
		return bad("max_num_tokens", s.MaxNumTokens, "> 0; auto calibration needs a finite token budget")
	case !(s.Percentile >= 0 && s.Percentile <= 100):
		return bad("ctx_cost.percentile", s.Percentile, "0 to 100")
	case s.MinSamples < 2:
		return bad("ctx_cost.min_samples", s.MinSamples, "≥ 2")
	case s.Window < s.MinSamples:
		return bad("ctx_cost.window", s.Window, fmt.Sprintf("≥ min_samples (%d)", s.MinSamples))
	case s.RefreshInterval < 1:
		return bad("ctx_cost.refresh_interval", s.RefreshInterval, "≥ 1")
	case !(s.Hysteresis >= 0) || math.IsInf(s.Hysteresis, 0):
		return bad("ctx_cost.hysteresis", s.Hysteresis, "a finite fraction ≥ 0")
	case !(s.OffsetMin > 0 && s.OffsetMin <= s.OffsetMax) || math.IsInf(s.OffsetMax, 0):
		return bad("ctx_cost offset bounds", fmt.Sprintf("[%v, %v]", s.OffsetMin, s.OffsetMax), "0 < min ≤ max, finite")
	}
	return nil
}

// Publication is one published cost model: what the scheduler installs with
// Scheduler.PublishCost(Offset, Threshold). Every field is a deterministic
// function of the observations, so ranks fed the same inputs publish
// bit-identical values.
type Publication struct {
	Offset    int64 // O = int(A / (c2 · M)), KV tokens
	Threshold int64 // D, KV tokens (a bucket centre)
	// Budget is (O + D) · M, the cost cap without the per-chunk term; the
	// scheduler adds R · D itself (scheduler.md §9.2).
	Budget int64
	A      float64 // ms of a full-budget iteration at depth 0
	C2     float64 // ms per token·KV
	// Iteration is the caller's iteration label passed to the refresh that
	// published; Observations the observation count at that refresh.
	Iteration    int64
	Observations int64
}

// Refresh describes the most recent refit, published or not, for logs.
type Refresh struct {
	Iteration    int64
	Observations int64
	Samples      int // windowed samples
	Kept         int // after dropping outliers and S ≤ 0
	A, C2        float64
	Offset       float64
	Threshold    int64
	Budget       float64 // (offset + threshold) · M
	// Published is true when this refit replaced the publication; Reason
	// says otherwise why not (a failed fit condition or the hysteresis).
	Published bool
	Reason    string
}

// Calibrator is the online calibrator of §9 (and §10 through ObserveFleet).
// It is a deterministic state machine: no clock (times arrive in ms as
// arguments), no randomness, no map iteration. Not safe for concurrent use;
// each rank owns one.
type Calibrator struct {
	set Settings

	// Ring buffer of the last Window accepted observations.
	n, s  []int64
	t     []float64
	next  int   // slot of the next write
	count int64 // accepted observations so far (never reset)

	hist [HistogramBuckets]int64 // token-weighted depth histogram

	lastRefit int64 // count at the last refit; -1 before any
	last      Refresh
	pub       Publication
	published bool
	pubBudget float64 // the float budget of pub, the hysteresis reference

	// §9.2 pass hook: the previous pass's start time and plan.
	passStarted bool
	passStartMS float64
	passN       int64
	passS       int64

	// Scratch reused by fits and fleet observations.
	pts    []point
	buf    []float64
	walls  []float64
	slopes []float64
}

// point is one normalised sample (§9.3 fit step 2).
type point struct{ x, y float64 }

// New returns a calibrator with no observations and no publication.
func New(s Settings) (*Calibrator, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	return &Calibrator{set: s, n: make([]int64, s.Window), s: make([]int64, s.Window),
		t: make([]float64, s.Window), lastRefit: -1}, nil
}

// Settings returns the calibrator's settings.
func (c *Calibrator) Settings() Settings { return c.set }

// Observations is the number of accepted observations so far.
func (c *Calibrator) Observations() int64 { return c.count }

// Published returns the current publication; ok is false before the first
// one, when the scheduler must run without a cost cap (§9.2).
func (c *Calibrator) Published() (pub Publication, ok bool) { return c.pub, c.published }

// LastRefresh describes the most recent refit; ok is false before any.
func (c *Calibrator) LastRefresh() (r Refresh, ok bool) { return c.last, c.lastRefit >= 0 }

// ObserveChunk adds a context chunk of n tokens starting at KV depth kv to
// the token-weighted depth histogram (§9.3): bucket min(63, kv div 16 384),
// weight n. A chunk with n ≤ 0 is ignored; a negative depth counts as 0.
func (c *Calibrator) ObserveChunk(kv, n int64) {
	if n <= 0 {
		return
	}
	c.hist[min(HistogramBuckets-1, max(0, kv)/BucketTokens)] += n
}

// ObserveIteration records one iteration: n scheduled tokens (context and
// generation), s = Σ chunk·(kv + chunk/2) of its context chunks, tMS its
// measured time. It is ignored (false) if n ≤ 0 or tMS is not a positive
// finite number; otherwise it enters the window and counts.
func (c *Calibrator) ObserveIteration(n, s int64, tMS float64) bool {
	if n <= 0 || !(tMS > 0) || math.IsInf(tMS, 0) {
		return false
	}
	c.n[c.next], c.s[c.next], c.t[c.next] = n, s, tMS
	c.next = (c.next + 1) % len(c.n)
	c.count++
	return true
}

// MaybeRefresh refits when the observation count is a positive multiple of
// RefreshInterval and has not been fitted yet (§9.3); iter labels the
// publication. It returns the current publication and whether this call
// replaced it. A failed fit keeps the previous publication.
func (c *Calibrator) MaybeRefresh(iter int64) (pub Publication, changed bool) {
	if c.count == 0 || c.count%int64(c.set.RefreshInterval) != 0 || c.count == c.lastRefit {
		return c.pub, false
	}
	c.lastRefit = c.count
	r := c.refit()
	r.Iteration, r.Observations = iter, c.count
	if r.Reason == "" && c.published && math.Abs(r.Budget-c.pubBudget) < c.set.Hysteresis*c.pubBudget {
		r.Reason = fmt.Sprintf("hysteresis: budget %.4g within %v of the published %.4g", r.Budget, c.set.Hysteresis, c.pubBudget)
	}
	if r.Reason == "" {
		o := int64(r.Offset)
		c.pub = Publication{Offset: o, Threshold: r.Threshold, Budget: (o + r.Threshold) * c.set.MaxNumTokens,
			A: r.A, C2: r.C2, Iteration: iter, Observations: c.count}
		c.pubBudget, c.published, r.Published = r.Budget, true, true
	}
	c.last = r
	return c.pub, r.Published
}

// refit runs fit steps 1–7 of §9.3 over the window. Reason is empty when
// every condition held.
func (c *Calibrator) refit() Refresh {
	var r Refresh
	r.Samples = int(min(c.count, int64(len(c.n))))
	if r.Samples < c.set.MinSamples {
		r.Reason = fmt.Sprintf("%d samples, need min_samples %d", r.Samples, c.set.MinSamples)
		return r
	}
	// Step 1: drop outliers (T ≥ 4 · median T) and samples without context.
	c.buf = append(c.buf[:0], c.t[:r.Samples]...)
	slices.Sort(c.buf)
	limit := 4 * medianSorted(c.buf)
	m := float64(c.set.MaxNumTokens)
	c.pts = c.pts[:0]
	for i := range r.Samples {
		if c.t[i] >= limit || c.s[i] <= 0 {
			continue
		}
		// Step 2: normalise to a full budget, where y = A + c2 · x.
		f := m / float64(c.n[i])
		c.pts = append(c.pts, point{x: float64(c.s[i]) * f, y: c.t[i] * f})
	}
	r.Kept = len(c.pts)
	if 2*r.Kept < c.set.MinSamples {
		samples := "samples"
		if r.Kept == 1 {
			samples = "sample"
		}
		r.Reason = fmt.Sprintf("%d %s left after dropping outliers and S ≤ 0, need %d", r.Kept, samples, (c.set.MinSamples+1)/2)
		return r
	}
	// Step 3: pair the k-th lowest x with the k-th of the highest half.
	slices.SortFunc(c.pts, func(a, b point) int { return cmp.Or(cmp.Compare(a.x, b.x), cmp.Compare(a.y, b.y)) })
	h := len(c.pts) / 2
	c.slopes = c.slopes[:0]
	for k := range h {
		lo, hi := c.pts[k], c.pts[len(c.pts)-h+k]
		if hi.x != lo.x {
			c.slopes = append(c.slopes, (hi.y-lo.y)/(hi.x-lo.x))
		}
	}
	if len(c.slopes) == 0 {
		r.Reason = "every pair has equal x: no slope"
		return r
	}
	slices.Sort(c.slopes)
	r.C2 = medianSorted(c.slopes)
	if !(r.C2 > 0) {
		r.Reason = fmt.Sprintf("c2 = %g ≤ 0: time does not grow with attention work", r.C2)
		return r
	}
	// Step 4: the intercept.
	c.buf = c.buf[:0]
	for _, p := range c.pts {
		c.buf = append(c.buf, p.y-r.C2*p.x)
	}
	slices.Sort(c.buf)
	r.A = medianSorted(c.buf)
	if !(r.A > 0) {
		r.Reason = fmt.Sprintf("A = %g ms ≤ 0", r.A)
		return r
	}
	// Step 5: the offset, within its bounds.
	r.Offset = r.A / (r.C2 * m)
	if !(r.Offset >= c.set.OffsetMin && r.Offset <= c.set.OffsetMax) {
		r.Reason = fmt.Sprintf("offset %.0f outside [%v, %v]", r.Offset, c.set.OffsetMin, c.set.OffsetMax)
		return r
	}
	// Step 6: the threshold, a bucket centre.
	var ok bool
	if r.Threshold, ok = c.threshold(); !ok {
		r.Reason = "no context chunk observed: empty depth histogram"
		return r
	}
	// Step 7.
	r.Budget = (r.Offset + float64(r.Threshold)) * m
	return r
}

// threshold is (b + 0.5) · 16 384 for the first bucket b whose cumulative
// weight reaches Percentile % of the total.
func (c *Calibrator) threshold() (int64, bool) {
	var total int64
	for _, w := range c.hist {
		total += w
	}
	if total == 0 {
		return 0, false
	}
	goal := c.set.Percentile * float64(total)
	var cum int64
	for b, w := range c.hist {
		cum += w
		if 100*float64(cum) >= goal {
			return int64(b)*BucketTokens + BucketTokens/2, true
		}
	}
	return int64(HistogramBuckets-1)*BucketTokens + BucketTokens/2, true
}

// StartPass is the scheduler hook of §9.2 for the uncorrected, per-rank
// mode, called at the start of every scheduling pass with the host time
// nowMS: the time since the previous pass's start is attributed to that
// pass's (N, S) (recorded by PassPlanned), then MaybeRefresh(iter) runs.
// The first pass observes nothing.
func (c *Calibrator) StartPass(iter int64, nowMS float64) (pub Publication, changed bool) {
	if c.passStarted {
		c.ObserveIteration(c.passN, c.passS, nowMS-c.passStartMS)
	}
	c.passStarted, c.passStartMS, c.passN, c.passS = true, nowMS, 0, 0
	return c.MaybeRefresh(iter)
}

// PassPlanned records the plan of the pass begun by the last StartPass: n
// scheduled tokens and s = Σ chunk·(kv + chunk/2). Its context chunks go to
// ObserveChunk separately.
func (c *Calibrator) PassPlanned(n, s int64) { c.passN, c.passS = n, s }
