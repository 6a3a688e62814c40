package scheduler

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Arrival validation from lengths alone: every rule of executor.md §3 step 4
// plus the 32-bit token range, with lengths far beyond any pool (the
// comparisons must not overflow). The reasons are matched whole: users and
// tests match them, so they never change.
func TestAdmissionVerdict(t *testing.T) {
	chunked := Config{ChunkedContext: true, MaxNumTokens: 64, Policy: MaxUtilization}
	noChunk := Config{ChunkedContext: false, MaxNumTokens: 64, Policy: MaxUtilization}
	gne := Config{ChunkedContext: true, MaxNumTokens: 64, Policy: GuaranteedNoEvict}
	pool := Admission{Pages: 32, LedgerBlockTokens: 8, Scheduler: chunked} // 256 tokens
	with := func(a Admission, f func(*Admission)) Admission { f(&a); return a }
	const int32Range = "exceeds the int32 token range (2147483647 tokens per sequence)"
	cases := []struct {
		name           string
		adm            Admission
		prompt, maxNew int
		rule           AdmissionRule // RuleNone = Fits
		reason         string
	}{
		{"fits exactly", pool, 200, 56, RuleNone, ""},
		{"one token over the pool", pool, 200, 57, RulePoolTokens,
			"prompt 200 + max_new_tokens 57 = 257 tokens can never fit the KV pool of 256 tokens (32 pages × 8)"},
		{"empty prompt", pool, 0, 5, RuleEmptyPrompt, "empty prompt"},
		{"negative prompt", pool, -3, 5, RuleEmptyPrompt, "empty prompt"},
		{"no generation", pool, 5, 0, RuleMaxNewTokens, "max_new_tokens must be at least 1"},
		{"negative generation", pool, 5, math.MinInt, RuleMaxNewTokens, "max_new_tokens must be at least 1"},
		{"int32 range: prompt", pool, math.MaxInt32 + 1, 1, RuleTokenRange,
			"prompt of 2147483648 tokens + max_new_tokens 1 " + int32Range},
		{"int32 range: sum", pool, math.MaxInt32 - 5, 6, RuleTokenRange,
			"prompt of 2147483642 tokens + max_new_tokens 6 " + int32Range},
		{"int32 range: sum at the limit is the pool's business", with(pool, func(a *Admission) { a.Pages = 1 << 40 }),
			math.MaxInt32 - 5, 5, RuleNone, ""},
		{"huge output", pool, 10, math.MaxInt, RuleTokenRange,
			"prompt of 10 tokens + max_new_tokens 9223372036854775807 " + int32Range},
		{"huge both", pool, math.MaxInt, math.MaxInt, RuleTokenRange,
			"prompt of 9223372036854775807 tokens + max_new_tokens 9223372036854775807 " + int32Range},
		{"chunking off", with(pool, func(a *Admission) { a.Scheduler = noChunk }), 65, 1, RuleUnchunkedPrompt,
			"prompt of 65 tokens exceeds max_num_tokens 64 and chunked prefill is off"},
		{"chunking off, prompt at the budget", with(pool, func(a *Admission) { a.Scheduler = noChunk }), 64, 1, RuleNone, ""},
		{"chunking off, unlimited budget", with(pool, func(a *Admission) {
			a.Scheduler = noChunk
			a.Scheduler.MaxNumTokens = Unlimited
		}), 65, 1, RuleNone, ""},
		{"max_seq_len", with(pool, func(a *Admission) { a.MaxSeqLen = 100 }), 100, 1, RuleMaxSeqLen,
			"prompt of 100 tokens + 1 exceeds max_seq_len 100"},
		{"max_seq_len exactly", with(pool, func(a *Admission) { a.MaxSeqLen = 100 }), 99, 50, RuleNone, ""},
		{"max_seq_len unset: the pool decides", pool, 255, 1, RuleNone, ""},
		{"guaranteed no evict", with(pool, func(a *Admission) { a.Scheduler = gne }), 250, 7, RulePagesToCompletion,
			"needs 33 pages to completion, the pool has 32"},
		{"guaranteed no evict, exactly the pool", with(pool, func(a *Admission) { a.Scheduler = gne }), 250, 6, RuleNone, ""},
		{"Helix ledger blocks", Admission{Pages: 32, LedgerBlockTokens: 16, Scheduler: chunked}, 500, 12, RuleNone, ""},
		{"the first rule that objects decides", with(pool, func(a *Admission) {
			a.Scheduler = noChunk
			a.MaxSeqLen = 10
		}), 300, 1, RuleUnchunkedPrompt, "prompt of 300 tokens exceeds max_num_tokens 64 and chunked prefill is off"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.adm.Verdict(c.prompt, c.maxNew)
			want := AdmissionVerdict{Code: NeverFits, Rule: c.rule, Reason: c.reason}
			if c.rule == RuleNone {
				want = AdmissionVerdict{}
			}
			require.Equal(t, want, got)
			// Against a pool with every page available the answer is the same.
			require.Equal(t, want, c.adm.VerdictNow(c.prompt, c.maxNew, c.adm.Pages))
		})
	}
}

// A request that can be served but whose pages are not available now waits: it
// gets WaitForPages, never NeverFits. The pages it needs now are its whole
// prompt's, or under GUARANTEED_NO_EVICT its reservation to completion.
func TestAdmissionVerdictNow(t *testing.T) {
	mu := Admission{Pages: 32, LedgerBlockTokens: 8, Scheduler: Config{ChunkedContext: true, MaxNumTokens: 64}}
	gne := mu
	gne.Scheduler.Policy = GuaranteedNoEvict
	cases := []struct {
		name                 string
		adm                  Admission
		prompt, maxNew, free int
		want                 AdmissionVerdict
	}{
		{"prompt pages free", mu, 40, 100, 5, AdmissionVerdict{}},
		{"one page short", mu, 41, 100, 5, AdmissionVerdict{Code: WaitForPages, Rule: RuleAvailablePages,
			Reason: "needs 6 pages, 5 of 32 are available now"}},
		{"nothing free", mu, 1, 1, 0, AdmissionVerdict{Code: WaitForPages, Rule: RuleAvailablePages,
			Reason: "needs 1 pages, 0 of 32 are available now"}},
		{"guaranteed no evict: the reservation", gne, 40, 100, 17, AdmissionVerdict{Code: WaitForPages, Rule: RuleAvailablePages,
			Reason: "needs 18 pages, 17 of 32 are available now"}},
		{"guaranteed no evict: reservation free", gne, 40, 100, 18, AdmissionVerdict{}},
		{"never fits stays never fits", mu, 200, 57, 0, AdmissionVerdict{Code: NeverFits, Rule: RulePoolTokens,
			Reason: "prompt 200 + max_new_tokens 57 = 257 tokens can never fit the KV pool of 256 tokens (32 pages × 8)"}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, c.adm.VerdictNow(c.prompt, c.maxNew, c.free), c.name)
	}
}

// CanPrefill is the chunking rule, shared by admission and the
// recompute-victim predicate.
func TestCanPrefill(t *testing.T) {
	cases := []struct {
		chunked bool
		m, n    int
		want    bool
	}{
		{true, 64, 1 << 40, true},
		{false, Unlimited, 1 << 40, true},
		{false, 64, 64, true},
		{false, 64, 65, false},
	}
	for _, c := range cases {
		cfg := Config{ChunkedContext: c.chunked, MaxNumTokens: c.m}
		require.Equal(t, c.want, cfg.CanPrefill(c.n), "chunked %v M %d prompt %d", c.chunked, c.m, c.n)
	}
}

// A verdict that admits costs nothing: rank 0 screens every arrival.
func TestAdmissionVerdictFitsAllocatesNothing(t *testing.T) {
	a := Admission{Pages: 32, LedgerBlockTokens: 8, Scheduler: Config{ChunkedContext: true, MaxNumTokens: 64}}
	allocs := testing.AllocsPerRun(100, func() {
		if a.VerdictNow(40, 100, 32).Code != Fits {
			t.Fatal("does not fit")
		}
	})
	require.Zero(t, allocs)
	require.Equal(t, "Fits WaitForPages NeverFits", Fits.String()+" "+WaitForPages.String()+" "+NeverFits.String())
}

// With chunking off, a recompute victim's reset prompt (prompt plus
// generated tokens, executor.md §11.2) may exceed M. Such a victim is still
// a candidate, and its re-prefill runs in chunks of at most M tokens
// (rechunked, a deliberate difference: the spec would schedule it whole,
// i.e. never). A prompt over M that is not a reset one keeps the spec's
// outcome: not scheduled (T-TOK-02).
func TestResetPromptOverMaxNumTokensIsRechunked(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		kv := newFakeKV()
		s, err := New(Config{MaxBatchSize: 4, MaxNumTokens: 20, ChunkedContext: chunked, ChunkUnitSize: 4,
			RecomputePause: true}, kv)
		require.NoError(t, err)
		atM := newReq(1, GenerationInProgress, 16, 16)
		atM.Generated = 4 // reset prompt 20 = M
		overM := newReq(2, GenerationInProgress, 16, 16)
		overM.Generated = 5 // reset prompt 21
		kv.setActive(1, 20)
		kv.setActive(2, 21)
		require.True(t, s.recomputeCandidate(atM), "chunked %v", chunked)
		require.True(t, s.recomputeCandidate(overM), "chunked %v", chunked)
	}

	s, err := New(Config{MaxBatchSize: 4, MaxNumTokens: 20, ChunkUnitSize: 4, RecomputePause: true}, newFakeKV())
	require.NoError(t, err)
	fresh := ctx(3, 21)
	out, err := s.Schedule([]*Request{fresh}, nil)
	require.NoError(t, err)
	require.Empty(t, out.Context, "a prompt over M without chunking is not scheduled (T-TOK-02)")

	reset := ctx(4, 21)
	reset.Recomputed = true
	out, err = s.Schedule([]*Request{reset}, nil)
	require.NoError(t, err)
	require.Equal(t, []*Request{reset}, out.Context)
	require.Equal(t, 20, reset.ChunkSize, "a chunk of M tokens, a multiple of the unit")
	require.Equal(t, []int{20}, out.Charged)
	reset.ContextPosition, reset.State = 20, ContextInProgress
	out, err = s.Schedule([]*Request{reset}, nil)
	require.NoError(t, err)
	require.Equal(t, []*Request{reset}, out.Context)
	require.Equal(t, 1, reset.ChunkSize, "the rest")

	// With chunking off the unit (here --chunk-unit 32, or a block of large
	// pages) may exceed M: the re-prefill still runs, in chunks of M
	// (found by a sweep: the reset prompts stalled the rank).
	for _, cfg := range []Config{{ChunkUnitSize: 32}, {LedgerBlockTokens: 32}} {
		cfg.MaxBatchSize, cfg.MaxNumTokens, cfg.RecomputePause = 4, 20, true
		s, err := New(cfg, newFakeKV())
		require.NoError(t, err)
		reset := ctx(5, 45)
		reset.Recomputed = true
		for _, want := range []int{20, 20, 5} {
			out, err := s.Schedule([]*Request{reset}, nil)
			require.NoError(t, err)
			require.Equal(t, []*Request{reset}, out.Context, "%+v", cfg)
			require.Equal(t, want, reset.ChunkSize, "%+v", cfg)
			reset.ContextPosition += reset.ChunkSize
			reset.State = ContextInProgress
		}
	}
}

// Under GUARANTEED_NO_EVICT a first chunk that cannot reserve to completion
// refuses every later first chunk of the pass (FCFS, §14.2), but a
// continuation behind it is still visited: it draws from its own
// reservation. The spec STOPs the whole walk, and with the continuation's
// reservation holding the pages the first chunk waits for, neither could
// ever run (found by a random configuration sweep of the twin: a request
// admitted while the one ahead was deferred by the prefix-aware skip).
func TestGNERefusedFirstChunkLetsContinuationsRun(t *testing.T) {
	f := newFakeKV()
	f.P, f.pages = 4, 9
	s, err := New(Config{MaxBatchSize: 8, MaxNumTokens: 64, ChunkedContext: true, ChunkUnitSize: 4,
		LedgerBlockTokens: 4, Policy: GuaranteedNoEvict}, f)
	require.NoError(t, err)
	// B (behind A in FCFS order) was admitted earlier: its first chunk of 4
	// tokens ran and it reserved its 5 pages to completion (12 + 8 tokens).
	b := ctx(2, 12)
	b.MaxNewTokens = 8
	require.True(t, f.PrepareContext(b))
	require.True(t, f.PrepareBlocksIfSchedulable(b, 4))
	b.ContextPosition, b.State = 4, ContextInProgress
	// A needs 6 pages (16 + 8 tokens); 9 − 5 = 4 are left.
	a := ctx(1, 16)
	a.MaxNewTokens = 8
	c := ctx(3, 4) // a later first chunk that would fit: FCFS, not tried
	c.MaxNewTokens = 4
	out, err := s.Schedule([]*Request{a, b, c}, nil)
	require.NoError(t, err)
	require.Equal(t, []*Request{b}, out.Context, "B's continuation runs; A and C wait")
	require.Equal(t, 8, b.ChunkSize)
	require.False(t, f.HasCache(a.ID), "A's refused admission left no cache")
	require.False(t, f.HasCache(c.ID), "C was not tried")
}

// NewTokens cuts max_new_tokens so that the sequence ends within
// max_seq_len, and Verdict judges the cut request: a reservation to
// completion that only the cut request fits is admitted.
func TestAdmissionNewTokensCutToMaxSeqLen(t *testing.T) {
	a := Admission{Pages: 10, LedgerBlockTokens: 4, MaxSeqLen: 40,
		Scheduler: Config{MaxNumTokens: 64, ChunkedContext: true, Policy: GuaranteedNoEvict}}
	for _, c := range []struct{ prompt, maxNew, want int }{
		{16, 50, 24}, {16, 24, 24}, {16, 10, 10}, {39, 5, 1}, {40, 5, 5}, // prompt + 1 > 40: Verdict rejects it, NewTokens leaves it
	} {
		require.Equal(t, c.want, a.NewTokens(c.prompt, c.maxNew), "prompt %d max_new %d", c.prompt, c.maxNew)
	}
	require.Equal(t, 1000, Admission{}.NewTokens(16, 1000), "no max_seq_len: no cut")
	// 16 + 50 = 66 tokens need 17 pages of the 10; cut to 40 tokens they need 10.
	require.Equal(t, Fits, a.Verdict(16, 50).Code)
	require.Equal(t, RuleMaxSeqLen, a.Verdict(40, 5).Rule)
	a.MaxSeqLen = 0
	require.Equal(t, RulePagesToCompletion, a.Verdict(16, 50).Rule, "without max_seq_len the whole request is judged")
}

// With demotion on, a context chunk visited before an earlier request (here
// B, whose small estimate keeps it NORMAL, ahead of the demoted
// continuation A) does not recompute-pause that earlier request when its
// pages are refused: victims come only from behind the requester, as under
// Helix, so the head of the list cannot be paused for a later arrival. A
// then grows into the free pages. (Spec §12 would pause A, the newest other
// request; docs/scheduling.md, "Demotion".) Without demotion A is visited
// first, grows, and is protected.
func TestDemotionPreemptsOnlyBehindTheRequester(t *testing.T) {
	for _, demote := range []bool{false, true} {
		f := newFakeKV()
		f.P, f.pages = 4, 12
		cfg := Config{MaxBatchSize: 8, MaxNumTokens: 64, ChunkedContext: true, ChunkUnitSize: 4, LedgerBlockTokens: 4,
			RecomputePause: true}
		if demote {
			cfg.Demotion = Demotion{UncachedTokens: 4}
		}
		s, err := New(cfg, f)
		require.NoError(t, err)
		a := withEst(contAt(1, 40, 8), 48) // 8 left > U: demoted
		f.setActive(1, 40)                 // 10 of the 12 pages
		b := withEst(ctx(2, 12), 4)        // estimate ≤ U: NORMAL, visited first with demotion; needs 3 pages
		out, err := s.Schedule([]*Request{a, b}, nil)
		require.NoError(t, err)
		require.Empty(t, out.RecomputePaused, "demotion %v: B may not pause A, which arrived first", demote)
		require.Equal(t, []*Request{a}, out.Context, "demotion %v: A grows into the 2 free pages", demote)
	}
}
