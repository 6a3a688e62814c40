package workload

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// scaleLen scales a length n in [1, MaxTokens] by a scale f that passed
// CheckLengthScale, rounding to nearest, at least 1. The result is at most
// MaxTokens × MaxLengthScale < 2^62, so it is exact in an int64.
func scaleLen(n int, f float64) int64 {
	v := math.Round(float64(n) * f)
	if !(v < 1<<62) {
		panic(fmt.Sprintf("workload: scaleLen(%d, %v): length or scale out of the checked range", n, f))
	}
	return max(1, int64(v))
}

// toInt converts a checked int64 length to int, saturating where int has
// 32 bits (a saturated length is still above MaxTokens, so it is rejected
// the same way).
func toInt(v int64) int {
	if v > math.MaxInt {
		return math.MaxInt
	}
	return int(v)
}

// ScaledBlockTokens is the hash-block size after length scaling (at least
// 1). f must pass CheckLengthScale.
func ScaledBlockTokens(f float64) int { return toInt(scaleLen(TraceBlockTokens, f)) }

// checkRecord validates a record's values (Read's parser checks them too,
// with the raw text in the message; this guards records built in code).
func checkRecord(rec Record) error {
	switch {
	case rec.TimestampMS < 0:
		return fmt.Errorf("field \"timestamp\" must be non-negative, got %d", rec.TimestampMS)
	case rec.InputLength < 1 || rec.InputLength > MaxTokens:
		return fmt.Errorf("field \"input_length\" must be in [1, %d], got %d", MaxTokens, rec.InputLength)
	case rec.OutputLength < 1 || rec.OutputLength > MaxTokens:
		return fmt.Errorf("field \"output_length\" must be in [1, %d], got %d", MaxTokens, rec.OutputLength)
	case len(rec.HashIDs) == 0:
		return errors.New("field \"hash_ids\" must not be empty")
	case rec.AttentionDPRank != nil && *rec.AttentionDPRank < 0:
		return fmt.Errorf("field \"attention_dp_rank\" must be non-negative, got %d", *rec.AttentionDPRank)
	}
	if want := (rec.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(rec.HashIDs) != want {
		return fmt.Errorf("field \"hash_ids\" has %d blocks but input_length %d needs %d blocks of %d tokens",
			len(rec.HashIDs), rec.InputLength, want, TraceBlockTokens)
	}
	return nil
}

// scaleArrival is timestamp × arrival scale as a duration, or an error when
// it lies beyond MaxReplay. ts ≥ 0 and a finite scale ≥ 0 keep the product
// non-negative; an overflowing product is +Inf, which the check refuses.
func scaleArrival(ts int64, opt Options) (time.Duration, error) {
	ms := float64(ts) * opt.ArrivalScale
	if !(ms <= float64(maxReplayMS)) {
		return 0, fmt.Errorf("field \"timestamp\": %d ms × %s %v is beyond the longest replay of %d ms (%d days)",
			ts, opt.arrivalScaleName(), opt.ArrivalScale, maxReplayMS, MaxReplay/(24*time.Hour))
	}
	return time.Duration(math.Round(ms * float64(time.Millisecond))), nil
}

// FromRecord turns a trace record into a request, scaling its lengths by
// opt.LengthScale so that the prefix structure is kept exactly: every block
// but the last has ScaledBlockTokens tokens, the last block keeps its scaled
// partial length (clamped to [1, block]), and the tokens of a block depend
// only on its hash id (a partial block is a prefix of the full one). No
// token is synthesised here (see Tokens). Errors name the option or the field.
func FromRecord(index int, rec Record, opt Options) (Request, error) {
	if err := opt.Validate(); err != nil {
		return Request{}, err
	}
	if err := checkRecord(rec); err != nil {
		return Request{}, err
	}
	arrival, err := scaleArrival(rec.TimestampMS, opt)
	if err != nil {
		return Request{}, err
	}
	bt := scaleLen(TraceBlockTokens, opt.LengthScale)
	n := int64(len(rec.HashIDs))
	last := scaleLen(rec.InputLength-TraceBlockTokens*int(n-1), opt.LengthScale)
	last = min(last, bt)
	// (n-1)·bt + last ≤ (MaxTokens/512)·(512·MaxLengthScale) + bt < 2^63.
	prompt := (n-1)*bt + last
	r := Request{
		Index:           index,
		Arrival:         arrival,
		PromptLen:       toInt(prompt),
		MaxNewTokens:    toInt(scaleLen(rec.OutputLength, opt.LengthScale)),
		ConversationID:  rec.ConversationID,
		HashIDs:         rec.HashIDs,
		BlockTokens:     toInt(bt),
		LastBlockTokens: toInt(last),
		vocab:           opt.VocabSize,
		seed:            opt.Seed,
	}
	r.Routing.AffinityID = rec.AffinityID
	if rec.AttentionDPRank != nil {
		r.Routing.HasRank, r.Routing.Rank = true, *rec.AttentionDPRank
	}
	if rec.AttentionDPRelax != nil {
		r.Routing.Strict = !*rec.AttentionDPRelax
	}
	return r, nil
}

// Tokens returns the prompt's token ids: Prompt when it is given, otherwise
// synthesised from the hash ids (a new slice of PromptLen tokens each call).
// Synthesis allocates 4 bytes per token: the caller checks PromptLen
// against what it can serve first.
func (r *Request) Tokens() []int32 {
	if r.Prompt != nil {
		return r.Prompt
	}
	out := make([]int32, 0, r.PromptLen)
	for b, h := range r.HashIDs {
		k := r.BlockTokens
		if b == len(r.HashIDs)-1 {
			k = r.LastBlockTokens
		}
		out = AppendBlockTokens(out, h, k, r.vocab, r.seed)
	}
	return out
}

// AppendBlockTokens appends the first k tokens of the block with hash id h.
// Token j is a splitmix64 hash of (seed, h, j) reduced to the vocabulary.
func AppendBlockTokens(dst []int32, h uint64, k, vocab int, seed uint64) []int32 {
	base := splitmix64(seed ^ splitmix64(h+0x9e3779b97f4a7c15))
	for j := 0; j < k; j++ {
		dst = append(dst, int32(splitmix64(base+uint64(j))%uint64(vocab)))
	}
	return dst
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
