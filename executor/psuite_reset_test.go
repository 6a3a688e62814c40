package executor

// P-suite (executor.md §12), P-01 and P-02: the reset for recompute and
// position continuity over a recompute pause.

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// ---------------------------------------------------------------------------
// P-01: reset for recompute
// ---------------------------------------------------------------------------

func TestP01ResetForRecompute(t *testing.T) {
	build := func() *request {
		r := newRequest(arrival(7, 16, 20))
		r.TotalInputLenCP = 16
		r.State = scheduler.GenerationInProgress
		r.ContextPosition = 16
		r.HelixDecodeCount = 8
		r.InactiveRank = true
		r.SeqLenThisRankCP = 9
		r.BatchIndex = 5
		r.UncachedEstimate = 33
		for i := 0; i < 9; i++ {
			r.output = append(r.output, int32(400+i))
		}
		r.Generated = 9
		return r
	}
	r := build()
	r.resetForRecompute()
	require.Zero(t, r.HelixDecodeCount, "g")
	require.False(t, r.InactiveRank)
	require.Equal(t, 25, r.TotalInputLenCP)
	require.Equal(t, scheduler.ContextInit, r.State)
	require.Zero(t, r.ContextPosition)
	require.Equal(t, 25, r.PromptLen)
	require.Equal(t, 25, r.ChunkSize)
	require.Equal(t, 11, r.MaxNewTokens)
	require.Zero(t, r.Generated)
	require.Equal(t, scheduler.NoBatchIndex, r.BatchIndex)
	require.Equal(t, int64(33), r.UncachedEstimate, "unchanged")
	require.Equal(t, append(slices.Clone(r.prompt), r.output...), r.Tokens, "prompt ++ generated tokens")
	require.Len(t, r.output, 9, "tokens already returned to the client are kept")
	require.Equal(t, 1, r.recomputed)

	// A second pause after 3 more tokens: global arithmetic again.
	r.State, r.Generated = scheduler.GenerationInProgress, 3
	r.output = append(r.output, 1, 2, 3)
	r.resetForRecompute()
	require.Equal(t, 28, r.TotalInputLenCP)
	require.Equal(t, 28, r.PromptLen)
	require.Equal(t, 8, r.MaxNewTokens)

	// A continuation (CONTEXT_IN_PROGRESS, nothing generated) keeps its prompt.
	c := newRequest(arrival(8, 40, 5))
	c.TotalInputLenCP, c.State, c.ContextPosition = 40, scheduler.ContextInProgress, 16
	c.resetForRecompute()
	require.Equal(t, 40, c.PromptLen)
	require.Equal(t, 40, c.TotalInputLenCP)
	require.Zero(t, c.ContextPosition)
	require.Equal(t, 5, c.MaxNewTokens)

	t.Run("SeqLenThisRankCP per CP rank", func(t *testing.T) {
		want := []int{13, 12}
		comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
		for rank := 0; rank < 2; rank++ {
			e := helixUnitExec(t, rank, comms[rank])
			r := inject(e, build())
			e.handlePaused(&scheduler.Output{RecomputePaused: []*scheduler.Request{&r.Request}})
			require.Equal(t, want[rank], r.SeqLenThisRankCP, "rank %d", rank)
		}
	})
}

// helixUnitExec builds CP rank `rank` of a 2-rank Helix group (P = 4).
func helixUnitExec(t *testing.T, rank int, comm nccl.Comm) *Executor {
	t.Helper()
	pool, err := kvpool.New(kvpool.Config{NumPages: 16, TokensPerPage: 4, CP: 2, CPRank: rank})
	require.NoError(t, err)
	sc := p03Sched()
	sch, err := scheduler.New(sc, pool)
	require.NoError(t, err)
	d := Deps{Comm: comm, Engine: newSeqEngine(rank, 2, 4, &recPlanner{}), KV: pool, Planner: sch}
	if rank == 0 {
		d.Source = &scriptSource{}
	}
	e, err := New(Config{Rank: rank, Ranks: 2, Helix: true, Scheduler: sc}, d)
	require.NoError(t, err)
	return e
}

// ---------------------------------------------------------------------------
// P-02: position continuity over a recompute pause
// ---------------------------------------------------------------------------

// TestP02PositionContinuity pauses one request after g decode steps on cp
// simulated CP ranks (each with its own Helix ledger and its own replica of
// the request), resets it like the executor, re-prefills it and decodes on.
// It checks the KV writes as one global prefix: a prefill or decode must
// extend the written prefix exactly, the re-prefill covers [0, T+g] (one
// position beyond what was written: the newest sampled token's), the first
// decode after it writes T+g+1, decode positions strictly increase, and the
// per-rank Helix fields are consistent at every step on every rank.
func TestP02PositionContinuity(t *testing.T) {
	for _, cp := range []int{2, 4} {
		for _, P := range []int{4, 32} {
			for _, T := range []int{16, 17, 63} {
				for _, g := range []int{0, 1, 7, 40} {
					name := fmt.Sprintf("cp%d P%d T%d g%d", cp, P, T, g)
					t.Run(name, func(t *testing.T) { p02Case(t, cp, P, T, g) })
				}
			}
		}
	}
}

// p02Ranks is the P-02 harness: cp simulated CP ranks, each with its own
// Helix ledger and its own replica of one request, and the global KV
// positions written so far.
type p02Ranks struct {
	t        *testing.T
	cp, P    int
	lb       int // ledger block: P·cp global tokens
	pools    []*kvpool.Manager
	reqs     []*request
	kvEnd    int // global KV positions [0, kvEnd) written so far
	decodes  []int
	prefills [][2]int
}

func newP02Ranks(t *testing.T, cp, P, T, maxNew int) *p02Ranks {
	h := &p02Ranks{t: t, cp: cp, P: P, lb: P * cp, pools: make([]*kvpool.Manager, cp), reqs: make([]*request, cp)}
	for r := range h.pools {
		var err error
		h.pools[r], err = kvpool.New(kvpool.Config{NumPages: 64, TokensPerPage: P, CP: cp, CPRank: r})
		require.NoError(t, err)
		h.reqs[r] = newRequest(arrival(1, T, maxNew))
		h.reqs[r].TotalInputLenCP = T // §3.5
	}
	return h
}

// sample is the request's next token, identical on every rank.
func (h *p02Ranks) sample(r *request) int32 { return int32(100 + len(r.output)) }

// samePools requires every rank's ledger to have rank 0's free pages.
func (h *p02Ranks) samePools(step string) {
	for r := 1; r < h.cp; r++ {
		require.Equal(h.t, h.pools[0].FreePages(), h.pools[r].FreePages(), "%s: ledger free pages differ on rank %d", step, r)
	}
}

// prefill runs the whole prompt on every rank and samples the first token.
func (h *p02Ranks) prefill() {
	t := h.t
	L := h.reqs[0].PromptLen
	require.Zero(t, h.reqs[0].ContextPosition)
	sum := 0
	for r, q := range h.reqs {
		require.True(t, h.pools[r].PrepareContext(&q.Request))
		require.True(t, h.pools[r].ResizeContext(&q.Request, q.PromptLen), "rank %d", r)
		require.Equal(t, L, h.pools[r].Capacity(q.ID))
		require.Len(t, h.pools[r].BlockTable(q.ID), (L+h.lb-1)/h.lb, "one local page per ledger block")
		q.ContextPosition = q.PromptLen
		h.pools[r].UpdateAfterContext(&q.Request)
		require.Equal(t, kvpool.HelixLocalLen(L, r, h.P, h.cp), q.SeqLenThisRankCP, "rank %d after the prefill", r)
		require.False(t, q.InactiveRank)
		sum += q.SeqLenThisRankCP
		q.State = scheduler.GenerationInProgress
		q.output = append(q.output, h.sample(q))
		q.Generated++
	}
	require.Equal(t, L, sum, "the ranks' local lengths add up to the prompt")
	h.prefills = append(h.prefills, [2]int{0, L})
	h.samePools("prefill")
}

// decode runs one generation step on every rank and checks its position.
func (h *p02Ranks) decode() {
	t := h.t
	pos := -1
	active := 0
	sum := 0
	for r, q := range h.reqs {
		gBefore := q.HelixDecodeCount
		require.True(t, h.pools[r].TryAllocateGeneration(&q.Request), "rank %d", r)
		require.Equal(t, gBefore+1, q.HelixDecodeCount)
		// The executor's StartPos of a decode row (buildStep).
		p := q.PromptLen + q.Generated - 1
		require.Equal(t, q.TotalInputLenCP+gBefore, p, "decode position = T + g")
		if pos < 0 {
			pos = p
		}
		require.Equal(t, pos, p, "rank %d decodes another position", r)
		require.Equal(t, p+1, h.pools[r].Capacity(q.ID), "capacity grows one token per step")
		if !q.InactiveRank {
			active++
			require.Equal(t, kvpool.HelixOwner(p, h.P, h.cp), r, "the active rank owns the position")
		}
		sum += q.SeqLenThisRankCP
	}
	require.Equal(t, 1, active, "exactly one active rank")
	require.Equal(t, pos+1, sum, "Σ SeqLenThisRankCP = pos + 1")
	require.Equal(t, h.kvEnd, pos, "a decode writes exactly the next position")
	h.kvEnd = pos + 1
	if len(h.decodes) > 0 {
		require.Greater(t, pos, h.decodes[len(h.decodes)-1], "decode positions strictly increase")
	}
	h.decodes = append(h.decodes, pos)
	for r, q := range h.reqs {
		q.output = append(q.output, h.sample(q))
		q.Generated++
		h.pools[r].UpdateAfterGeneration(&q.Request)
	}
	h.samePools("decode")
}

// pause frees the victim like the scheduler (identical ledger blocks on
// every rank) and resets it like the executor, after T + g written positions.
func (h *p02Ranks) pause(T, g int) {
	t := h.t
	for r, q := range h.reqs {
		before, blocks := h.pools[r].FreePages(), len(h.pools[r].BlockTable(q.ID))
		require.Equal(t, (T+g+h.lb-1)/h.lb, blocks)
		h.pools[r].Free(&q.Request)
		require.Equal(t, before+blocks, h.pools[r].FreePages(), "rank %d gets every ledger block back", r)
		q.resetForRecompute()
		require.Equal(t, T+g+1, q.PromptLen)
		require.Equal(t, T+g+1, q.TotalInputLenCP)
		require.Equal(t, append(slices.Clone(q.prompt), q.output...), q.Tokens)
	}
	h.samePools("free")
}

func p02Case(t *testing.T, cp, P, T, g int) {
	const after = 3 // decodes after the re-prefill
	h := newP02Ranks(t, cp, P, T, g+after+5)
	h.prefill()
	h.kvEnd = T
	for i := 0; i < g; i++ {
		h.decode()
	}
	require.Equal(t, T+g, h.kvEnd, "KV written before the pause: [0, T+g)")
	require.Len(t, h.reqs[0].output, g+1, "n = g + 1 tokens held")

	h.pause(T, g)

	h.prefill()
	require.Equal(t, [2]int{0, T + g + 1}, h.prefills[1], "the re-prefill covers [0, T+g]")
	require.Equal(t, h.kvEnd+1, h.prefills[1][1], "the re-prefill adds exactly the one unwritten position")
	h.kvEnd = h.prefills[1][1]
	for i := 0; i < after; i++ {
		h.decode()
	}
	require.Equal(t, T+g+1, h.decodes[g], "the first decode after the re-prefill writes T' = T+g+1")
	for i := 1; i < len(h.decodes); i++ {
		gap := h.decodes[i] - h.decodes[i-1]
		if i == g {
			require.Equal(t, 2, gap, "across the pause the skipped position is the re-prefill's last")
		} else {
			require.Equal(t, 1, gap)
		}
	}
	for r := range h.pools {
		require.NoError(t, h.pools[r].CheckInvariants())
	}
}
