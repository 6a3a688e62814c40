package kvpool

import (
	"math"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// The Helix ledger (kvcache.md §10): one sequence's KV is sharded over cp
// ranks. The bookkeeping runs in global tokens with ledger block P·cp (one
// physical page on every CP rank), so every rank performs the same
// allocations; only the per-rank fields below differ. They are pure
// functions of (T, g, rank), so a retry in the same pass gives identical
// fields on every rank.

// HelixOwner is the CP rank holding global position p: (p div P) mod cp.
func HelixOwner(p, P, cp int) int { return (p / P) % cp }

// HelixLocalLen is the number of the first L global tokens owned by rank r:
// with L = q·(P·cp) + m, q·P + clamp(m − r·P, 0, P). It is also the local
// index of position L on its owner.
func HelixLocalLen(L, r, P, cp int) int {
	q, rem := L/(P*cp), L%(P*cp)
	return q*P + min(P, max(0, rem-r*P))
}

// HelixDecodeFields derives rank r's fields for a decode step writing
// position T + g (§10.5): the active rank owns that position and its
// SeqLenThisRankCP is local_len(pos, r) + 1; every other rank is inactive
// with local_len(pos, r). Summed over ranks: pos + 1.
func HelixDecodeFields(T, g, r, P, cp int) (seqLen int, inactive bool) {
	pos := T + g
	seqLen = HelixLocalLen(pos, r, P, cp)
	if HelixOwner(pos, P, cp) == r {
		return seqLen + 1, false
	}
	return seqLen, true
}

// HelixPastLen is the model engine's past length for a decode step:
// SeqLenThisRankCP − 1 on the active rank, SeqLenThisRankCP on inactive
// ones (so Σ past = pos).
func HelixPastLen(seqLen int, inactive bool) int {
	if inactive {
		return seqLen
	}
	return seqLen - 1
}

// HelixDummyFields are the frozen fields of a CUDA-graph padding dummy
// (§10.8), token_num ≥ 2: the last CP rank is active with prompt length
// token_num − 1, the others inactive with token_num; SeqLenThisRankCP is
// that prompt length; TotalInputLenCP = token_num·cp − 1.
func HelixDummyFields(tokenNum, r, cp int) (promptLen, seqLen int, inactive bool, totalInputLen int) {
	promptLen, inactive = tokenNum, true
	if r == cp-1 {
		promptLen, inactive = tokenNum-1, false
	}
	return promptLen, promptLen, inactive, tokenNum*cp - 1
}

// helixT is the request's global prompt length T (TotalInputLenCP, or
// PromptLen before the executor set it).
func helixT(r *scheduler.Request) int {
	if r.TotalInputLenCP > 0 {
		return r.TotalInputLenCP
	}
	return r.PromptLen
}

// UnlimitedTokens is the token count that stands for "no limit" (+inf) in
// the quota conversions; it passes through them unchanged.
const UnlimitedTokens = math.MaxInt64

// HelixTokensFromLocal converts a rank-local physical token capacity t
// (tokens_from_quota of a rank-local quota) into global ledger tokens
// (§10.7): (t div P)·P·cp, since a partial trailing page is unusable.
// cp ≤ 1 is the identity; UnlimitedTokens passes through.
func HelixTokensFromLocal(t int64, P, cp int) int64 {
	if cp <= 1 || t == UnlimitedTokens {
		return t
	}
	return t / int64(P) * int64(P) * int64(cp)
}

// HelixLocalTokensFromGlobal converts N global ledger tokens into the
// rank-local tokens their pages hold (§10.7): ceil(N / (P·cp))·P (not
// ceil(N / cp)). cp ≤ 1 is the identity.
func HelixLocalTokensFromGlobal(N int64, P, cp int) int64 {
	if cp <= 1 || N == UnlimitedTokens {
		return N
	}
	lb := int64(P) * int64(cp)
	return (N + lb - 1) / lb * int64(P)
}
