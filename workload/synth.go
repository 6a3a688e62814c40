package workload

import "math"

// scaleLen scales a length by f, rounding to nearest, at least 1.
func scaleLen(n int, f float64) int {
	v := int(math.Round(float64(n) * f))
	if v < 1 {
		v = 1
	}
	return v
}

// ScaledBlockTokens is the hash-block size after length scaling (at least 1).
func ScaledBlockTokens(f float64) int { return scaleLen(TraceBlockTokens, f) }

// Synthesize turns a trace record into a request. Lengths are scaled by
// opt.LengthScale so that the prefix structure is kept exactly: every block
// but the last has ScaledBlockTokens tokens, the last block keeps its scaled
// partial length (clamped to [1, block]), and the tokens of a block depend
// only on its hash id (a partial block is a prefix of the full one).
func Synthesize(index int, rec Record, opt Options) Request {
	bt := ScaledBlockTokens(opt.LengthScale)
	n := len(rec.HashIDs)
	last := rec.InputLength - TraceBlockTokens*(n-1)
	lastScaled := scaleLen(last, opt.LengthScale)
	if lastScaled > bt {
		lastScaled = bt
	}
	prompt := make([]int32, 0, bt*(n-1)+lastScaled)
	for b, h := range rec.HashIDs {
		k := bt
		if b == n-1 {
			k = lastScaled
		}
		prompt = AppendBlockTokens(prompt, h, k, opt.VocabSize, opt.Seed)
	}
	return Request{
		Index:          index,
		ArrivalMS:      rec.TimestampMS,
		Prompt:         prompt,
		MaxNewTokens:   scaleLen(rec.OutputLength, opt.LengthScale),
		ConversationID: rec.ConversationID,
		HashIDs:        rec.HashIDs,
		BlockTokens:    bt,
	}
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
