package goengine

import "github.com/lockstep-ai/lockstep/bridge"

// CopyResult overwrites every field of dst with src's, reusing dst's slices
// when large enough (the bridge.Engine contract for a caller's result).
// src keeps its arrays, so an engine may reuse them for its next step.
func CopyResult(dst, src *bridge.StepResult) {
	dst.Sampled = append(dst.Sampled[:0], src.Sampled...)
	dst.Logits = append(dst.Logits[:0], src.Logits...)
	dst.Logprobs = append(dst.Logprobs[:0], src.Logprobs...)
	dst.TopLogprobIDs = append(dst.TopLogprobIDs[:0], src.TopLogprobIDs...)
	dst.TopLogprobs = append(dst.TopLogprobs[:0], src.TopLogprobs...)
	dst.ScoreLogprobs = append(dst.ScoreLogprobs[:0], src.ScoreLogprobs...)
	dst.ScoreTopIDs = append(dst.ScoreTopIDs[:0], src.ScoreTopIDs...)
	dst.ScoreTopLogprobs = append(dst.ScoreTopLogprobs[:0], src.ScoreTopLogprobs...)
	dst.ScoreRanks = append(dst.ScoreRanks[:0], src.ScoreRanks...)
	dst.DeviceMS = src.DeviceMS
	dst.MoEWaitMS = src.MoEWaitMS
}

// Resize returns s with length n, reusing its array when large enough
// (its contents are then stale: the caller overwrites every element).
func Resize(s []int32, n int) []int32 {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]int32, n)
}

// Mix64 is the splitmix64 finaliser (Steele, Lea, Flood, "Fast splittable
// pseudorandom number generators", OOPSLA'14): the engines' deterministic
// hash of seeds, tokens and positions. Its constants are part of every
// fake and twin token: changing them changes every run's outputs.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
