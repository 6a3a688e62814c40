package bridge

import (
	"fmt"
	"math"
)

// MaxLogprobs is the most top log-probabilities a sequence may ask for
// (ENG_MAX_LOGPROBS; vLLM's default max_logprobs).
const MaxLogprobs = 20

// ValidateLogprobs checks a sequence's log-probability request: TopLogprobs
// in [0, MaxLogprobs], and only with Logprobs.
func (s *SeqStep) ValidateLogprobs() error {
	switch {
	case s.TopLogprobs < 0 || s.TopLogprobs > MaxLogprobs:
		return fmt.Errorf("top_logprobs must be in [0, %d], got %d", MaxLogprobs, s.TopLogprobs)
	case s.TopLogprobs > 0 && !s.Logprobs:
		return fmt.Errorf("top_logprobs = %d needs logprobs", s.TopLogprobs)
	}
	return nil
}

// lpLogit is a logit as the log-probabilities see it: NaN → −Inf, +Inf →
// MaxFloat32.
func lpLogit(v float32) float32 {
	if v != v {
		return float32(math.Inf(-1))
	}
	if v > math.MaxFloat32 {
		return math.MaxFloat32
	}
	return v
}

// samplingLog is log(x) for x ≥ 1 with +, −, ×, / and exact scaling only,
// rounding exactly as native/src/sampling.cpp's sampling_log: x = f·2^e with
// f in [√½, √2), log f = 2·atanh(z), z = (f−1)/(f+1), by its odd series to
// z^21 in Horner form.
func samplingLog(x float64) float64 {
	f, e := math.Frexp(x)
	if f < 0.70710678118654752440 {
		f, e = f*2, e-1
	}
	const (
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
	)
	z := (f - 1) / (f + 1)
	z2 := z * z
	p := 1.0 / 21.0
	for n := 19; n >= 1; n -= 2 {
		p = float64(p*z2) + 1/float64(n)
	}
	de := float64(e)
	return float64(de*ln2Hi) + (float64(float64(2*z)*p) + float64(de*ln2Lo))
}

// RowLogprobs computes the log-probabilities of one logits row exactly as
// the native engines do (eng_sampling.logprobs in native/include/engine.h;
// vLLM's raw_logprobs: log_softmax of the logits before any processor,
// temperature or truncation): token's is returned, and the top
// min(len(ids), len(row)) ids with theirs are written to ids and lps,
// highest first, ties to the lower id. len(lps) must be ≥ len(ids) and
// len(ids) ≤ MaxLogprobs. The sums are in float64: m = the largest logit,
// s = Σ exp(l − m) over the ids in order, lp = float32((l − m) − log s).
func RowLogprobs(row []float32, token int32, ids []int32, lps []float32) float32 {
	V := len(row)
	k := min(len(ids), V)
	n := 0
	m := float32(math.Inf(-1))
	for i, l := range row {
		v := lpLogit(l)
		if v > m {
			m = v
		}
		if k == 0 || (n == k && !(v > lpLogit(row[ids[n-1]]))) {
			continue
		}
		j := k - 1
		if n < k {
			j = n
			n++
		}
		for j > 0 && v > lpLogit(row[ids[j-1]]) {
			ids[j] = ids[j-1]
			j--
		}
		ids[j] = int32(i)
	}
	if math.IsInf(float64(m), -1) {
		u := float32(-samplingLog(float64(V)))
		for j := range n {
			lps[j] = u
		}
		return u
	}
	dm := float64(m)
	sum := 0.0
	for _, l := range row {
		sum += samplingExp(float64(lpLogit(l)) - dm)
	}
	lse := samplingLog(sum)
	lp := func(id int32) float32 { return float32((float64(lpLogit(row[id])) - dm) - lse) }
	for j := range n {
		lps[j] = lp(ids[j])
	}
	return lp(token)
}

// FillLogprobs writes sequence i's log-probabilities into res (the layout
// of StepResult.Logprobs) from its logits row; the pure-Go engines' share of
// the contract. res's logprob slices must already hold len(Seqs) and
// len(Seqs)·MaxLogprobs entries.
func FillLogprobs(res *StepResult, i int, row []float32, s *SeqStep, token int32) {
	ids := res.TopLogprobIDs[i*MaxLogprobs : (i+1)*MaxLogprobs]
	lps := res.TopLogprobs[i*MaxLogprobs : (i+1)*MaxLogprobs]
	for j := range ids {
		ids[j], lps[j] = -1, 0
	}
	res.Logprobs[i] = 0
	if s.Sample && s.Logprobs {
		res.Logprobs[i] = RowLogprobs(row, token, ids[:s.TopLogprobs], lps)
	}
}

// WantsLogprobs reports whether some sampled sequence of desc asks for
// log-probabilities (StepResult.Logprobs is then filled).
func (d *StepDesc) WantsLogprobs() bool {
	for i := range d.Seqs {
		if d.Seqs[i].Sample && d.Seqs[i].Logprobs {
			return true
		}
	}
	return false
}

// ResizeLogprobs sizes res's logprob slices for n sequences (want) or
// empties them (reusing their arrays).
func ResizeLogprobs(res *StepResult, n int, want bool) {
	if !want {
		res.Logprobs, res.TopLogprobIDs, res.TopLogprobs = res.Logprobs[:0], res.TopLogprobIDs[:0], res.TopLogprobs[:0]
		return
	}
	res.Logprobs = resize(res.Logprobs, n)
	res.TopLogprobIDs = resize(res.TopLogprobIDs, n*MaxLogprobs)
	res.TopLogprobs = resize(res.TopLogprobs, n*MaxLogprobs)
}

func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// ValidateScore checks a sequence's scoring request: ScoreTargets nil or
// one per token, each −1 or in [0, vocab); ScoreTop in [0, MaxLogprobs].
func (s *SeqStep) ValidateScore(vocab int) error {
	if s.ScoreTop < 0 || s.ScoreTop > MaxLogprobs {
		return fmt.Errorf("score_top must be in [0, %d], got %d", MaxLogprobs, s.ScoreTop)
	}
	if s.ScoreTargets == nil {
		return nil
	}
	if len(s.ScoreTargets) != len(s.Tokens) {
		return fmt.Errorf("score_targets has %d entries for %d tokens", len(s.ScoreTargets), len(s.Tokens))
	}
	for k, t := range s.ScoreTargets {
		if t < -1 || int(t) >= vocab {
			return fmt.Errorf("score_targets[%d] = %d outside [0, vocab_size %d) (-1 = not scored)", k, t, vocab)
		}
	}
	return nil
}

// Scores reports whether some row of the sequence is scored.
func (s *SeqStep) Scores() bool {
	for _, t := range s.ScoreTargets {
		if t >= 0 {
			return true
		}
	}
	return false
}

// WantsScores reports whether some row of desc is scored
// (StepResult.ScoreLogprobs is then filled), and the step's rows.
func (d *StepDesc) WantsScores() (bool, int) {
	want, rows := false, 0
	for i := range d.Seqs {
		want = want || d.Seqs[i].Scores()
		rows += len(d.Seqs[i].Tokens)
	}
	return want, rows
}

// ResizeScores sizes res's score slices for rows rows, reset to 0, −1, 0
// (want), or empties them (reusing their arrays).
func ResizeScores(res *StepResult, rows int, want bool) {
	if !want {
		res.ScoreLogprobs, res.ScoreTopIDs, res.ScoreTopLogprobs = res.ScoreLogprobs[:0], res.ScoreTopIDs[:0], res.ScoreTopLogprobs[:0]
		res.ScoreRanks = res.ScoreRanks[:0]
		return
	}
	res.ScoreRanks = resize(res.ScoreRanks, rows)
	clear(res.ScoreRanks)
	res.ScoreLogprobs = resize(res.ScoreLogprobs, rows)
	res.ScoreTopIDs = resize(res.ScoreTopIDs, rows*MaxLogprobs)
	res.ScoreTopLogprobs = resize(res.ScoreTopLogprobs, rows*MaxLogprobs)
	clear(res.ScoreLogprobs)
	clear(res.ScoreTopLogprobs)
	for j := range res.ScoreTopIDs {
		res.ScoreTopIDs[j] = -1
	}
}

// FillScore writes row r's score into res (the layout of
// StepResult.ScoreLogprobs) from its logits row: the pure-Go engines'
// share of the scoring contract.
func FillScore(res *StepResult, r int, row []float32, target int32, top int) {
	at := r * MaxLogprobs
	res.ScoreLogprobs[r] = RowLogprobs(row, target, res.ScoreTopIDs[at:at+top], res.ScoreTopLogprobs[at:at+MaxLogprobs])
	res.ScoreRanks[r] = RowRank(row, target)
}

// RowRank is token's rank in a logits row as the native engines compute
// it (vLLM's): how many ids have a logit at least its own (NaN as −Inf,
// +Inf as MaxFloat32), so the most probable token's is 1.
func RowRank(row []float32, token int32) int32 {
	t := lpLogit(row[token])
	n := int32(0)
	for _, l := range row {
		if lpLogit(l) >= t {
			n++
		}
	}
	return n
}
