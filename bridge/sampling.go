package bridge

import (
	"fmt"
	"math"
	"slices"
)

// SamplingParams is how a sequence's sampled token is drawn (eng_sampling in
// native/include/engine.h; docs/sampling.md). The zero value is greedy and
// valid: Temperature 0 is greedy argmax (lowest index on ties), TopK 0 keeps
// every token and TopP 0 means "no top-p" (the native ABI's top_p 1).
type SamplingParams struct {
	Temperature float32 // 0 = greedy; > 0 divides the logits
	TopK        int     // keep the TopK largest logits; 0 = all
	TopP        float32 // nucleus mass in (0, 1]; 0 or 1 = all
	Seed        uint64  // the request's seed: key of the Philox draw
	// MinP drops the ids whose probability is below MinP times the largest
	// (after the temperature); 0 = off.
	MinP float32
	// The penalties of vLLM (and OpenAI), applied to the logits before the
	// temperature (ApplyProcessors); 0 = off (RepetitionPenalty: 0 or 1).
	PresencePenalty, FrequencyPenalty, RepetitionPenalty float32
}

// TokenBias is one logit_bias entry: Bias is added to the logit of ID.
type TokenBias struct {
	ID   int32
	Bias float32
}

// HasPenalties reports whether p has a presence, frequency or repetition
// penalty (which read the sequence's tokens).
func (p SamplingParams) HasPenalties() bool {
	return p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1)
}

// IsGreedy reports whether p picks the argmax (Temperature 0).
func (p SamplingParams) IsGreedy() bool { return p.Temperature == 0 }

// Validate checks every field: finite, Temperature ≥ 0, TopK ≥ 0 and
// 0 ≤ TopP ≤ 1 (0 = no top-p). A greedy p is validated too.
func (p SamplingParams) Validate() error {
	t, tp := float64(p.Temperature), float64(p.TopP)
	switch {
	case math.IsNaN(t) || math.IsInf(t, 0) || t < 0:
		return fmt.Errorf("sampling temperature must be finite and >= 0, got %g", t)
	case p.TopK < 0 || p.TopK > math.MaxInt32:
		return fmt.Errorf("sampling top_k must be in [0, %d] (0 = all tokens), got %d", math.MaxInt32, p.TopK)
	case math.IsNaN(tp) || tp < 0 || tp > 1:
		return fmt.Errorf("sampling top_p must be in [0, 1] (0 or 1 = all tokens), got %g", tp)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("sampling min_p must be in [0, 1], got %g", p.MinP)
	case !finite32(p.PresencePenalty):
		return fmt.Errorf("sampling presence_penalty must be finite, got %g", p.PresencePenalty)
	case !finite32(p.FrequencyPenalty):
		return fmt.Errorf("sampling frequency_penalty must be finite, got %g", p.FrequencyPenalty)
	case !finite32(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("sampling repetition_penalty must be finite and >= 0 (0 or 1 = off), got %g", p.RepetitionPenalty)
	}
	return nil
}

func finite32(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// ValidateBias checks a logit bias for a vocabulary of vocab ids: ids in
// range, finite biases.
func ValidateBias(bias []TokenBias, vocab int) error {
	for j, b := range bias {
		if b.ID < 0 || int(b.ID) >= vocab {
			return fmt.Errorf("logit bias %d: token id %d is outside the vocabulary [0, %d)", j, b.ID, vocab)
		}
		if !finite32(b.Bias) {
			return fmt.Errorf("logit bias %d (token %d): the bias must be finite, got %g", j, b.ID, b.Bias)
		}
	}
	return nil
}

// HasProcessors reports whether a step of s changes the logits before the
// pick (a logit bias or a penalty): its row is then processed, greedy
// included.
func (s *SeqStep) HasProcessors() bool {
	return len(s.LogitBias) > 0 || s.Sampling.HasPenalties() || s.Allowed != nil
}

// AllowedWords is the length of an allowed-token mask for a vocabulary of
// vocab ids.
func AllowedWords(vocab int) int { return (vocab + 31) / 32 }

// ValidateAllowed checks an allowed-token mask (SeqStep.Allowed) for a
// vocabulary of vocab ids: nil, or AllowedWords(vocab) words with at least
// one id of the vocabulary set.
func ValidateAllowed(mask []uint32, vocab int) error {
	if mask == nil {
		return nil
	}
	if len(mask) != AllowedWords(vocab) {
		return fmt.Errorf("the allowed-token mask has %d words, a vocabulary of %d ids takes %d", len(mask), vocab, AllowedWords(vocab))
	}
	for w, m := range mask {
		if n := vocab - 32*w; n < 32 {
			m &= 1<<n - 1
		}
		if m != 0 {
			return nil
		}
	}
	return fmt.Errorf("the allowed-token mask allows no token")
}

// IsAllowed reports whether mask allows id (a nil mask allows every id).
func IsAllowed(mask []uint32, id int32) bool {
	return mask == nil || mask[id/32]>>(id%32)&1 != 0
}

// ApplyProcessors applies the logits processors of s to row in place, in
// the order and the float32 arithmetic of native/src/sampling.cpp (engine.h's
// eng_sampling): logit bias (in order), repetition penalty over the distinct
// ids of PromptTokens and OutputTokens (l > 0 ? l / r : l * r), then for
// each distinct id of OutputTokens, l -= FrequencyPenalty * count, then
// l -= PresencePenalty, then -inf for every id Allowed does not set. The
// ids must be in range.
func ApplyProcessors(row []float32, s *SeqStep) {
	p := &s.Sampling
	for _, b := range s.LogitBias {
		row[b.ID] = row[b.ID] + b.Bias
	}
	if rp := p.RepetitionPenalty; rp != 0 && rp != 1 {
		ids := make([]int32, 0, len(s.PromptTokens)+len(s.OutputTokens))
		ids = append(append(ids, s.PromptTokens...), s.OutputTokens...)
		slices.Sort(ids)
		for i, id := range ids {
			if i > 0 && id == ids[i-1] {
				continue
			}
			if l := row[id]; l > 0 {
				row[id] = l / rp
			} else {
				row[id] = float32(l * rp)
			}
		}
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		ids := slices.Clone(s.OutputTokens)
		slices.Sort(ids)
		for i := 0; i < len(ids); {
			j := i
			for j < len(ids) && ids[j] == ids[i] {
				j++
			}
			l := row[ids[i]]
			l = l - float32(p.FrequencyPenalty*float32(j-i))
			l = l - p.PresencePenalty
			row[ids[i]] = l
			i = j
		}
	}
	if s.Allowed != nil {
		inf := float32(math.Inf(-1))
		for id := range row {
			if s.Allowed[id/32]>>(id%32)&1 == 0 {
				row[id] = inf
			}
		}
	}
}

// SampleSeq picks the token of s from its logits row exactly as the native
// engines do: the logits processors (on a copy; logits is not changed),
// then Sample.
func SampleSeq(logits []float32, s *SeqStep) int32 {
	if s.HasProcessors() {
		logits = slices.Clone(logits)
		ApplyProcessors(logits, s)
	}
	return Sample(logits, s.Sampling, s.SamplePos())
}

// NativeTopP is TopP as the native ABI takes it: 0 becomes 1 (no top-p).
func (p SamplingParams) NativeTopP() float32 {
	if p.TopP == 0 {
		return 1
	}
	return p.TopP
}

// Philox4x32 is Philox4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11): counter ctr, key key → four output words.
func Philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	const (
		m0, m1 = 0xD2511F53, 0xCD9E8D57 // round multipliers
		w0, w1 = 0x9E3779B9, 0xBB67AE85 // Weyl key increments
	)
	c0, c1, c2, c3 := ctr[0], ctr[1], ctr[2], ctr[3]
	k0, k1 := key[0], key[1]
	for round := range 10 {
		if round > 0 {
			k0 += w0
			k1 += w1
		}
		p0, p1 := uint64(m0)*uint64(c0), uint64(m1)*uint64(c2)
		c0, c1, c2, c3 = uint32(p1>>32)^c1^k0, uint32(p1), uint32(p0>>32)^c3^k1, uint32(p0)
	}
	return [4]uint32{c0, c1, c2, c3}
}

// SamplingUniform is the uniform in [0, 1) of the draw at absolute position
// pos: the top 24 bits of the first word of Philox4x32-10 with key
// {seed low, seed high} and counter {pos low, pos high, 0, 0}.
func SamplingUniform(seed uint64, pos int64) float64 {
	out := Philox4x32([4]uint32{uint32(pos), uint32(uint64(pos) >> 32), 0, 0}, [2]uint32{uint32(seed), uint32(seed >> 32)})
	return float64(out[0]>>8) * (1.0 / 16777216.0)
}

// samplingExp is exp(x) for x ≤ 0 with +, −, × and exact scaling only,
// rounding exactly as native/src/sampling.cpp's sampling_exp (every product
// is rounded before the add: the float64 conversions forbid fused
// multiply-adds). 0 for x < −700.
func samplingExp(x float64) float64 {
	if !(x >= -700) {
		return 0
	}
	if x > 0 {
		x = 0
	}
	const (
		log2e = 1.44269504088896338700e+00
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
	)
	k := math.Floor(float64(x*log2e) + 0.5)
	r := float64(x-float64(k*ln2Hi)) - float64(k*ln2Lo)
	p := 1.0 / 6227020800.0
	for _, c := range [...]float64{1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
		1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0} {
		p = float64(p*r) + c
	}
	return p * math.Float64frombits(uint64(int64(k)+1023)<<52)
}

// Argmax is the greedy pick: the lowest index of the maximum (NaN never wins).
func Argmax(logits []float32) int32 {
	best := 0
	for i := 1; i < len(logits); i++ {
		if logits[i] > logits[best] {
			best = i
		}
	}
	return int32(best)
}

// Sample picks the token of one logits row under p for the token at
// absolute position pos (the position of the last input token + 1), with
// exactly the procedure of the native engines (docs/sampling.md):
// logits/temperature in float32 (NaN → −Inf, +Inf → MaxFloat32), keep the
// TopK largest (ties: lower id), softmax in float64 over them in descending
// order, keep the smallest prefix whose cumulative probability ≥ TopP,
// renormalise, and take the first token whose cumulative probability
// exceeds SamplingUniform(p.Seed, pos). MinP cuts the kept prefix where
// exp(s_j - s_0) < MinP (after top-k, before top-p). p must be valid; Temperature 0 is
// Argmax.
func Sample(logits []float32, p SamplingParams, pos int64) int32 {
	if p.IsGreedy() {
		return Argmax(logits)
	}
	V := len(logits)
	scaled := make([]float32, V)
	for i, l := range logits {
		v := l / p.Temperature
		if v != v {
			v = float32(math.Inf(-1))
		}
		if v > math.MaxFloat32 {
			v = math.MaxFloat32
		}
		scaled[i] = v
	}
	order := make([]int32, V)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		switch {
		case scaled[a] > scaled[b]:
			return -1
		case scaled[a] < scaled[b]:
			return 1
		}
		return int(a) - int(b)
	})
	k := V
	if p.TopK > 0 && p.TopK < V {
		k = p.TopK
	}
	m := float64(scaled[order[0]])
	if math.IsInf(m, -1) {
		return order[0]
	}
	prob := make([]float64, k)
	sum := 0.0
	for j := range k {
		prob[j] = samplingExp(float64(scaled[order[j]]) - m)
		if j > 0 && p.MinP > 0 && prob[j] < float64(p.MinP) {
			// min_p: the rest is below MinP times the largest probability.
			k, prob = j, prob[:j]
			break
		}
		sum += prob[j]
	}
	for j := range prob {
		prob[j] /= sum
	}
	n := k
	if topP := p.NativeTopP(); topP < 1 {
		cum := 0.0
		for j := range k {
			cum += prob[j]
			if cum >= float64(topP) {
				n = j + 1
				break
			}
		}
	}
	total := 0.0
	for j := range n {
		total += prob[j]
	}
	u := SamplingUniform(p.Seed, pos)
	cum := 0.0
	for j := range n {
		cum += prob[j] / total
		if cum > u {
			return order[j]
		}
	}
	return order[n-1]
}
