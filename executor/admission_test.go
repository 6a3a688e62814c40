package executor

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Arrival validation from lengths alone: every rule of executor.md §3 step 4
// plus the 32-bit token range, with lengths far beyond any pool (the
// comparisons must not overflow).
func TestAdmissionNeverFits(t *testing.T) {
	chunked := scheduler.Config{ChunkedContext: true, MaxNumTokens: 64, Policy: scheduler.MaxUtilization}
	noChunk := scheduler.Config{ChunkedContext: false, MaxNumTokens: 64, Policy: scheduler.MaxUtilization}
	gne := scheduler.Config{ChunkedContext: true, MaxNumTokens: 64, Policy: scheduler.GuaranteedNoEvict}
	pool := Admission{Pages: 32, LedgerBlockTokens: 8, Scheduler: chunked} // 256 tokens
	with := func(a Admission, f func(*Admission)) Admission { f(&a); return a }
	cases := []struct {
		name           string
		adm            Admission
		prompt, maxNew int
		want           string // "" = may be served
	}{
		{"fits exactly", pool, 200, 56, ""},
		{"one token over the pool", pool, 200, 57, "prompt 200 + max_new_tokens 57 = 257 tokens can never fit the KV pool of 256 tokens (32 pages × 8)"},
		{"empty prompt", pool, 0, 5, "empty prompt"},
		{"no generation", pool, 5, 0, "max_new_tokens must be at least 1"},
		{"negative generation", pool, 5, math.MinInt, "max_new_tokens must be at least 1"},
		{"int32 range: prompt", pool, math.MaxInt32 + 1, 1, "prompt of 2147483648 tokens + max_new_tokens 1 exceeds the int32 token range (2147483647 tokens per sequence)"},
		{"int32 range: sum", pool, math.MaxInt32 - 5, 6, "exceeds the int32 token range"},
		{"int32 range: sum at the limit is the pool's business", with(pool, func(a *Admission) { a.Pages = 1 << 40 }), math.MaxInt32 - 5, 5, ""},
		{"huge output", pool, 10, math.MaxInt, "prompt of 10 tokens + max_new_tokens 9223372036854775807 exceeds the int32 token range"},
		{"huge both", pool, math.MaxInt, math.MaxInt, "exceeds the int32 token range"},
		{"chunking off", with(pool, func(a *Admission) { a.Scheduler = noChunk }), 65, 1, "prompt of 65 tokens exceeds max_num_tokens 64 and chunked prefill is off"},
		{"chunking off, unlimited budget", with(pool, func(a *Admission) {
			a.Scheduler = noChunk
			a.Scheduler.MaxNumTokens = scheduler.Unlimited
		}), 65, 1, ""},
		{"max_seq_len", with(pool, func(a *Admission) { a.MaxSeqLen = 100 }), 100, 1, "prompt of 100 tokens + 1 exceeds max_seq_len 100"},
		{"max_seq_len unset: the pool decides", pool, 255, 1, ""},
		{"guaranteed no evict", with(pool, func(a *Admission) { a.Scheduler = gne }), 250, 7, "needs 33 pages to completion, the pool has 32"},
		{"Helix ledger blocks", Admission{Pages: 32, LedgerBlockTokens: 16, Scheduler: chunked}, 500, 12, ""},
	}
	for _, c := range cases {
		got := c.adm.NeverFits(c.prompt, c.maxNew)
		if c.want == "" {
			require.Empty(t, got, c.name)
		} else {
			require.Contains(t, got, c.want, c.name)
		}
	}
}
