package executor

// Trace-equality property (executor.md §7): over random workloads and
// configurations, every rank enters the same collectives element by
// element, every request is answered exactly once with the same tokens as a
// reference run (one rank, roomy pool), and no page leaks.

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// propCase is one random scenario.
type propCase struct {
	reqs      []Arrival
	staggered bool
	ranks     int
	helix     bool
	overlap   bool
	ppt       int
	pages     int
	tight     bool
	sc        scheduler.Config
}

func (c propCase) String() string {
	return fmt.Sprintf("reqs %d staggered %v ranks %d helix %v overlap %v P %d pages %d (tight %v) chunked %v M %d batch %d policy %v prefix %v",
		len(c.reqs), c.staggered, c.ranks, c.helix, c.overlap, c.ppt, c.pages, c.tight, c.sc.ChunkedContext,
		c.sc.MaxNumTokens, c.sc.MaxBatchSize, c.sc.Policy, c.sc.PrefixAware)
}

// source builds the arrival script: everything in iteration 0, or each
// request (in id order) at a random, non-decreasing iteration.
func (c propCase) source(rng *rand.Rand) *scriptSource {
	if !c.staggered {
		return allAtOnce(c.reqs...)
	}
	var byIter [][]Arrival
	k := 0
	for _, a := range c.reqs {
		k += rng.IntN(4)
		for len(byIter) <= k {
			byIter = append(byIter, nil)
		}
		byIter[k] = append(byIter[k], a)
	}
	return &scriptSource{byIter: byIter}
}

func randomCase(rng *rand.Rand) propCase {
	c := propCase{ranks: 1 + rng.IntN(4), overlap: rng.IntN(2) == 0, staggered: rng.IntN(2) == 0,
		ppt: []int{4, 8}[rng.IntN(2)]}
	c.helix = c.ranks > 1 && rng.IntN(3) == 0
	// Requests; some share a prefix (prefix reuse is off under Helix).
	n := 3 + rng.IntN(12)
	shared := make([]int32, 24)
	for i := range shared {
		shared[i] = int32(rng.IntN(509))
	}
	maxPrompt, maxTotal := 0, 0
	for i := 0; i < n; i++ {
		prompt := make([]int32, 1+rng.IntN(60))
		for k := range prompt {
			prompt[k] = int32(rng.IntN(509))
		}
		if rng.IntN(3) == 0 {
			copy(prompt, shared)
		}
		a := Arrival{ID: uint64(i), Prompt: prompt, MaxNewTokens: 1 + rng.IntN(25)}
		c.reqs = append(c.reqs, a)
		maxPrompt = max(maxPrompt, len(prompt))
		maxTotal = max(maxTotal, len(prompt)+a.MaxNewTokens)
	}
	// Pool: roomy, or barely above the largest request (forces preemption).
	lb := c.ppt
	if c.helix {
		lb *= c.ranks
	}
	c.pages = 512 / c.ppt
	if c.tight = rng.IntN(2) == 0; c.tight {
		c.pages = (maxTotal+lb-1)/lb + 1 + rng.IntN(3)
	}
	// Scheduler.
	c.sc = defaultSched()
	c.sc.MaxBatchSize = 1 + rng.IntN(16)
	c.sc.ChunkedContext = rng.IntN(2) == 0
	c.sc.ChunkUnitSize = []int{4, 8}[rng.IntN(2)]
	if c.sc.ChunkedContext {
		c.sc.MaxNumTokens = []int{16, 32, 64, scheduler.Unlimited}[rng.IntN(4)]
	} else {
		// Every prompt fits a pass (arrival rejects longer ones); a
		// recompute-reset prompt (prompt + generated tokens) may not, and is
		// then re-prefilled in chunks (TestRecomputeResetBeyondMaxNumTokens).
		c.sc.MaxNumTokens = max(maxPrompt, c.sc.ChunkUnitSize) + rng.IntN(maxTotal-maxPrompt+40)
	}
	c.sc.PrefixAware = rng.IntN(2) == 0
	if !c.helix && rng.IntN(4) == 0 {
		c.sc.Policy = scheduler.GuaranteedNoEvict
	}
	return c
}

func TestPropertyTracesEqualAndOutputsMatchReference(t *testing.T) {
	recomputed, helixRuns, tightRuns, overM, priorityRuns, scoredRuns := 0, 0, 0, 0, 0, 0
	// The race pass checks the ranks' synchronisation: 300 seeds exercise
	// it as well as 1 500 do.
	seeds := uint64(racetest.Size(1500, 300))
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x10c57e9))
		c := randomCase(rng)
		// A third of the cases give their requests priorities (-1, 0 or
		// 1), from a generator of their own so that every case is
		// otherwise the one its seed always gave.
		if prng := rand.New(rand.NewPCG(seed, 0x7072696f)); prng.IntN(3) == 0 {
			for i := range c.reqs {
				c.reqs[i].Priority = int32(prng.IntN(3)) - 1
			}
			priorityRuns++
		}
		// A third ask some requests for their prompt's log-probabilities
		// (again from a generator of their own): every layout, chunking
		// and preemption must give the reference's entries.
		if prng := rand.New(rand.NewPCG(seed, 0x73636f72)); prng.IntN(3) == 0 {
			for i := range c.reqs {
				if prng.IntN(2) == 0 {
					c.reqs[i].PromptLogprobs, c.reqs[i].PromptTopLogprobs = true, prng.IntN(4)
				}
			}
			scoredRuns++
		}
		name := fmt.Sprintf("seed %d: %v", seed, c)

		// Reference: one rank, roomy pool, everything at once, same engine family.
		ref := (&rig{n: 1, seqEngine: c.helix, src: allAtOnce(c.reqs...)}).build(t)
		ref.run()
		ref.requireNoErrors(t)
		want := ref.outputs(t)
		require.Len(t, want, len(c.reqs), name)

		g := (&rig{n: c.ranks, helix: c.helix, overlap: c.overlap, ppt: c.ppt, pages: c.pages, sc: c.sc,
			src: c.source(rng)}).build(t)
		g.run()
		for _, rr := range g.ranks {
			require.NoError(t, rr.err, "%s: rank %d", name, rr.rank)
		}
		// Every rank entered the same collectives, element by element.
		base := g.ranks[0].comm.Trace()
		for _, rr := range g.ranks[1:] {
			require.Equal(t, base, rr.comm.Trace(), "%s: trace of rank %d", name, rr.rank)
			require.Equal(t, g.ranks[0].res.Iterations, rr.res.Iterations, "%s: rank %d exit iteration", name, rr.rank)
		}
		// Every request answered exactly once, with the reference tokens.
		got := g.outputs(t)
		require.Len(t, got, len(c.reqs), name)
		for _, a := range c.reqs {
			r := got[a.ID]
			require.Empty(t, r.Error, "%s: request %d", name, a.ID)
			require.Len(t, r.Output, a.MaxNewTokens, "%s: request %d", name, a.ID)
			require.Equal(t, want[a.ID].Output, r.Output, "%s: request %d", name, a.ID)
			if a.PromptLogprobs && len(a.Prompt) > 1 {
				require.Len(t, r.PromptLogprobs, len(a.Prompt)-1, "%s: request %d", name, a.ID)
			}
			require.Equal(t, want[a.ID].PromptLogprobs, r.PromptLogprobs, "%s: request %d: prompt log-probabilities", name, a.ID)
			recomputed += r.Recomputed
			if r.Recomputed > 0 && !c.sc.ChunkedContext && len(a.Prompt)+a.MaxNewTokens > c.sc.MaxNumTokens {
				overM++ // may have been re-prefilled in chunks with chunking off
			}
		}
		if c.helix {
			helixRuns++
			// CP ranks hold replicas: every rank sampled the same tokens.
			for _, rr := range g.ranks[1:] {
				for id, l := range g.ranks[0].seq.life {
					require.Equal(t, l.sampled, rr.seq.life[id].sampled, "%s: rank %d request %d", name, rr.rank, id)
				}
			}
		}
		if c.tight {
			tightRuns++
		}
		for _, rr := range g.ranks {
			require.NoError(t, rr.pool.CheckInvariants(), "%s: rank %d", name, rr.rank)
			require.Equal(t, rr.pool.TotalPages(), rr.pool.FreePages(), "%s: rank %d leaked pages", name, rr.rank)
		}
	}
	t.Logf("%d recompute preemptions (%d of requests longer than M with chunking off), %d Helix runs, %d tight pools",
		recomputed, overM, helixRuns, tightRuns)
	// The generator must exercise what the property is about.
	require.Positive(t, recomputed, "no run forced a recompute preemption")
	require.Positive(t, overM, "no run reset a request that can outgrow M with chunking off")
	require.Positive(t, helixRuns)
	require.Positive(t, tightRuns)
	require.Positive(t, priorityRuns)
	require.Positive(t, scoredRuns)
}

// TestRecomputeResetBeyondMaxNumTokens: with chunking off, arrival
// validation only checks the original prompt against M, but a recompute
// reset grows the prompt by the generated tokens. Two requests of prompt 16
// and 20 new tokens with M = 20 in a pool of 48 tokens cannot both finish
// without such a reset, and the reset prompt exceeds M. It is re-prefilled
// in chunks of at most M (scheduler.rechunked; before, the scheduler refused
// such victims and the pool deadlocked until the fatal stall error): both
// requests are served, with exactly the tokens a pool that holds both to
// completion gives them.
func TestRecomputeResetBeyondMaxNumTokens(t *testing.T) {
	sc := defaultSched()
	sc.ChunkedContext, sc.MaxNumTokens, sc.PrefixAware = false, 20, false
	for _, overlap := range []bool{false, true} {
		var outs [2]map[uint64]Response
		for i, pages := range []int{12, 18} {
			g := (&rig{n: 1, overlap: overlap, ppt: 4, pages: pages, sc: sc,
				src: allAtOnce(arrival(0, 16, 20), arrival(1, 16, 20))}).build(t)
			g.run()
			g.requireNoErrors(t)
			outs[i] = g.outputs(t)
			require.Len(t, outs[i], 2)
			recomputed := 0
			for id, r := range outs[i] {
				require.Empty(t, r.Error, "request %d", id)
				require.Len(t, r.Output, 20, "request %d", id)
				recomputed += r.Recomputed
			}
			if pages == 12 {
				require.Positive(t, recomputed, "the small pool must force a reset (overlap %v)", overlap)
			}
			g.requireNoLeaks(t)
		}
		for id, r := range outs[0] {
			require.Equal(t, outs[1][id].Output, r.Output, "request %d: a reset changes no token", id)
		}
	}
}

// TestContextPreemptionReachesSuspendedCacheWithoutHostTier: found by the
// property test (seed 427 of an earlier, wider seed range). Without a host
// tier, a generation request G that cannot grow self-evicts (rung 3,
// scheduler.md §11.3): its cache is suspended but its pages stay on the GPU.
// The older context request C ahead of it then fails its chunk allocation and
// tries context preemption (§12), which skips G because "its cache is not
// active" — so C waits for pages G holds, G waits for a page C would free,
// and the scheduler stalls until the fatal stall error. Expected: C's
// context preemption frees G (a recompute candidate behind it) and C's
// chunk is scheduled in a later pass.
func TestContextPreemptionReachesSuspendedCacheWithoutHostTier(t *testing.T) {
	pool, err := kvpool.New(kvpool.Config{NumPages: 5, TokensPerPage: 4})
	require.NoError(t, err)
	sc := scheduler.Config{MaxBatchSize: 8, MaxNumTokens: 64, ChunkedContext: true, ChunkUnitSize: 4,
		Policy: scheduler.MaxUtilization, RecomputePause: true, LedgerBlockTokens: 4}
	sch, err := scheduler.New(sc, pool)
	require.NoError(t, err)
	// C: prompt 16, first chunk of 8 done (2 pages), older.
	c := newRequest(arrival(0, 16, 4))
	require.True(t, pool.PrepareContext(&c.Request))
	require.True(t, pool.ResizeContext(&c.Request, 8))
	c.ContextPosition, c.State = 8, scheduler.ContextInProgress
	pool.UpdateAfterContext(&c.Request)
	// G: prompt 12 prefilled (3 pages, full), one token generated, newer.
	g := asGeneration(t, pool, newRequest(arrival(1, 12, 10)))
	require.Zero(t, pool.FreePages())
	list := []*scheduler.Request{&c.Request, &g.Request}
	scheduled := false
	for pass := 0; pass < 4 && !scheduled; pass++ {
		out, err := sch.Schedule(list, nil)
		require.NoError(t, err)
		for _, r := range out.RecomputePaused {
			if r.ID == g.ID {
				g.State, g.ContextPosition = scheduler.ContextInit, 0 // what the executor's reset does
			}
		}
		scheduled = len(out.Context) > 0 && out.Context[0].ID == c.ID
		t.Logf("pass %d: context %v generation %v paused %v recompute-paused %v free %d", pass,
			idsOf(out.Context), idsOf(out.Generation), idsOf(out.Paused), idsOf(out.RecomputePaused), pool.FreePages())
	}
	require.True(t, scheduled, "C's next chunk must eventually be scheduled")
}

// TestMaxNewTokensCutToMaxSeqLen: a request whose prompt plus
// max_new_tokens exceeds max_seq_len has its max_new_tokens cut on arrival
// (TensorRT-LLM's request validation does the same) and finishes by length
// there, under both policies and loops, with one warning for the run.
// Before, the sequence ran into the KV pool's max_seq_len cap while
// decoding: MAX_UTILIZATION stalled until the fatal stall error,
// GUARANTEED_NO_EVICT failed with a reservation violation.
func TestMaxNewTokensCutToMaxSeqLen(t *testing.T) {
	for _, policy := range []scheduler.Policy{scheduler.MaxUtilization, scheduler.GuaranteedNoEvict} {
		for _, overlap := range []bool{false, true} {
			sc := defaultSched()
			sc.Policy = policy
			g := (&rig{n: 2, overlap: overlap, ppt: 4, pages: 64, sc: sc, maxSeqLen: 40,
				src: allAtOnce(arrival(0, 16, 50), arrival(1, 30, 10), arrival(2, 8, 4), arrival(3, 39, 5))}).build(t)
			g.run()
			g.requireNoErrors(t)
			out := g.outputs(t)
			want := map[uint64]int{0: 24, 1: 10, 2: 4, 3: 1}
			for id, n := range want {
				require.Empty(t, out[id].Error, "policy %v overlap %v request %d", policy, overlap, id)
				require.Len(t, out[id].Output, n, "policy %v overlap %v request %d", policy, overlap, id)
			}
			cuts := 0
			for _, n := range g.ranks[0].notes {
				if strings.Contains(n.Text, "exceeds max_seq_len 40: max_new_tokens cut to") {
					require.Equal(t, scheduler.LevelWarn, n.Level)
					cuts++
				}
			}
			require.Equal(t, 1, cuts, "one warning for the run")
			g.requireNoLeaks(t)
		}
	}
}
