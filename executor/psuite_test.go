package executor

// P-suite (executor.md §12): aggregated-Helix preemption at executor level.
// The scenarios run real schedulers over real kvpool Helix ledgers, one per
// simulated CP rank, either driven directly or through whole executors (the
// rig of rig_test.go with the content-checking seqEngine, since the fake
// engine refuses Helix).
//
// Covered elsewhere: P-04 … P-07 scheduler-level with a scripted KV in
// scheduler/helix_test.go (T-HX-01 … 07; P-05 and P-07 are repeated here
// through whole executors); P-08 by kvpool's construction guards and
// cmd/worker's option validation; P-14 … P-19 and P-22 in
// schedcheck_test.go. P-11 does not apply: this executor never creates
// Helix CUDA-graph dummies (padding dummies exist only under attention DP,
// which is exclusive with Helix); their frozen fields are kvpool's
// (HelixDummyFields). P-23 needs the GPU engine.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// ---------------------------------------------------------------------------
// P-03, P-05, P-07, P-09, P-10: the §11.8 worked scenario through executors
// ---------------------------------------------------------------------------

// p03Sched: non-overlap §11.8 scheduler configuration (chunking off,
// recompute pause on; ledger block 8 is set by the rig).
func p03Sched() scheduler.Config {
	return scheduler.Config{MaxBatchSize: 4, MaxNumTokens: 64, ChunkUnitSize: 8, Policy: scheduler.MaxUtilization,
		RecomputePause: true, Helix: true, LedgerBlockTokens: 8}
}

// p03Rig: cp = 2, P = 4, 6 ledger blocks; A (id 0) and B (id 1), prompt 16,
// 20 new tokens each, arriving together.
func p03Rig(t *testing.T, pages int, overlap, recompute bool) *rig {
	sc := p03Sched()
	sc.RecomputePause = recompute
	return (&rig{n: 2, helix: true, check: true, overlap: overlap, pages: pages, ppt: 4, sc: sc,
		src: allAtOnce(arrival(0, 16, 20), arrival(1, 16, 20))}).build(t)
}

const idA, idB = uint64(0), uint64(1)

func TestP03WorkedScenario(t *testing.T) {
	ref := p03Rig(t, 64, false, true)
	ref.drive(0)
	ref.requireNoErrors(t)

	g := p03Rig(t, 6, false, true)
	// B's fields right after pass 10 (iteration 9), per rank.
	type fields struct {
		total, prompt, maxNew, g, index int
		state                           scheduler.State
		inactive                        bool
		tokens                          []int32
	}
	var bAfter10 [2]fields
	var activeAfter10 [2][]uint64
	g.after = func(rr *rigRank) {
		if len(rr.snaps) == 10 {
			b := rr.ex.byID[idB]
			bAfter10[rr.rank] = fields{b.TotalInputLenCP, b.PromptLen, b.MaxNewTokens, b.HelixDecodeCount,
				slices.Index(rr.ex.active, b), b.State, b.InactiveRank, slices.Clone(b.Tokens)}
			activeAfter10[rr.rank] = activeIDs(rr.ex)
		}
	}
	g.drive(0)
	g.requireNoErrors(t)
	g.requireEqualTraces(t)

	// Identical decisions on both ranks at every pass.
	p0, p1 := g.ranks[0].plan.passes, g.ranks[1].plan.passes
	p03RequireSameDecisions(t, p0, p1)
	p03RequireTable(t, p0)

	p03RequireVictimFree(t, g)

	// The reset of B (pass 10), identical on both ranks apart from nothing.
	for r := 0; r < 2; r++ {
		f := bAfter10[r]
		require.Equal(t, 25, f.total, "rank %d TotalInputLenCP", r)
		require.Equal(t, 25, f.prompt)
		require.Equal(t, 11, f.maxNew)
		require.Zero(t, f.g)
		require.False(t, f.inactive)
		require.Equal(t, scheduler.ContextInit, f.state)
		require.Equal(t, 1, f.index, "B keeps its index in active")
		require.Equal(t, []uint64{idA, idB}, activeAfter10[r])
	}
	require.Equal(t, bAfter10[0].tokens, bAfter10[1].tokens)

	p03RequirePositions(t, g)

	// Outputs equal an unconstrained run; B was recomputed once.
	out, want := g.outputs(t), ref.outputs(t)
	for _, id := range []uint64{idA, idB} {
		require.Len(t, out[id].Output, 20)
		require.Equal(t, want[id].Output, out[id].Output, "request %d", id)
	}
	require.Equal(t, 1, out[idB].Recomputed)
	require.Zero(t, out[idA].Recomputed)
	require.Zero(t, ref.outputs(t)[idB].Recomputed)
	require.Equal(t, int64(31), g.ranks[0].res.Iterations)
	g.requireNoLeaks(t)

	// The schedule check ran once per pass: one digest allgather each.
	digests := 0
	for _, e := range g.ranks[0].comm.Trace() {
		if e.String() == "allgather:schedule_digest" {
			digests++
		}
	}
	require.Equal(t, 31, digests)
}

// p03RequireSameDecisions requires both ranks' passes to agree field by field.
func p03RequireSameDecisions(t *testing.T, p0, p1 []passRec) {
	require.Len(t, p0, 31, "31 passes (§11.8)")
	require.Equal(t, len(p0), len(p1))
	for i := range p0 {
		a, b := p0[i], p1[i]
		require.Equal(t, a.recomputed, b.recomputed, "pass %d RecomputePaused", i+1)
		require.Equal(t, a.ctx, b.ctx, "pass %d context", i+1)
		require.Equal(t, a.gen, b.gen, "pass %d generation", i+1)
		require.Equal(t, a.satOut, b.satOut, "pass %d sat out", i+1)
		require.Equal(t, a.freeAfter, b.freeAfter, "pass %d ledger free count", i+1)
		require.Equal(t, a.caps, b.caps, "pass %d ledger capacities", i+1)
	}
}

// p03RequireTable requires rank 0's passes to follow the table of §11.8,
// pass by pass (1-based).
func p03RequireTable(t *testing.T, p0 []passRec) {
	for pass := 1; pass <= 31; pass++ {
		p := p0[pass-1]
		var ctx, gen, rec []uint64
		var free int
		caps := map[uint64]int{}
		switch {
		case pass == 1:
			ctx, free = []uint64{idA, idB}, 2
			caps = map[uint64]int{idA: 16, idB: 16}
		case pass <= 9:
			gen, free = []uint64{idA, idB}, 0
			caps = map[uint64]int{idA: 15 + pass, idB: 15 + pass}
		case pass == 10:
			gen, rec, free = []uint64{idA}, []uint64{idB}, 2
			caps = map[uint64]int{idA: 25}
		case pass <= 20:
			gen, free = []uint64{idA}, 2
			if pass >= 18 {
				free = 1 // A's 5th block at capacity 33
			}
			caps = map[uint64]int{idA: 15 + pass}
		case pass == 21:
			ctx, free = []uint64{idB}, 2
			caps = map[uint64]int{idB: 25}
		default:
			gen, free = []uint64{idB}, 2
			if pass >= 29 {
				free = 1 // B's 5th block at capacity 33
			}
			caps = map[uint64]int{idB: pass + 4}
		}
		orEmpty := func(v []uint64) []uint64 {
			if v == nil {
				return []uint64{}
			}
			return v
		}
		require.Equal(t, orEmpty(ctx), p.ctx, "pass %d context", pass)
		require.Equal(t, orEmpty(gen), p.gen, "pass %d generation", pass)
		require.Equal(t, orEmpty(rec), p.recomputed, "pass %d recompute-paused", pass)
		require.Empty(t, p.satOut, "pass %d", pass)
		require.Equal(t, free, p.freeAfter, "pass %d ledger free blocks after scheduling", pass)
		require.Equal(t, caps, p.caps, "pass %d capacities", pass)
		if pass >= 11 && pass <= 20 {
			require.Contains(t, p.active, idB, "pass %d: B waits (SKIP) without preempting A", pass)
		}
	}
}

// p03RequireVictimFree is P-09 at pass 10: Free(B) with capacity 24 returns
// 3 ledger blocks on every rank (free 0 → 3), then A takes one (free 2).
func p03RequireVictimFree(t *testing.T, g *rig) {
	for _, rr := range g.ranks {
		var bFrees []freeRec
		for _, f := range rr.kv.frees {
			if f.id == idB {
				bFrees = append(bFrees, f)
			}
		}
		require.Len(t, bFrees, 2, "rank %d: the victim free, then the final free", rr.rank)
		require.Equal(t, freeRec{id: idB, capBefore: 24, before: 0, after: 3}, bFrees[0], "rank %d", rr.rank)
	}
}

// p03RequirePositions checks the positions as the engine saw them, on both
// ranks: A decodes 16 … 34; B prefills, is paused, re-prefills 0 … 24 and
// decodes on from 25.
func p03RequirePositions(t *testing.T, g *rig) {
	for _, rr := range g.ranks {
		a, b := rr.seq.life[idA], rr.seq.life[idB]
		require.Equal(t, [][2]int{{0, 16}}, a.prefills)
		require.Equal(t, seq(16, 35), a.decodes, "A decodes positions 16 … 34")
		require.Equal(t, [][2]int{{0, 16}, {0, 25}}, b.prefills, "B re-prefills positions 0 … 24")
		require.Equal(t, append(seq(16, 24), seq(25, 35)...), b.decodes, "B: 16 … 23, then 25 … 34")
		require.Equal(t, 1, b.incarnations)
	}
	require.Equal(t, g.ranks[0].seq.life[idB].sampled, g.ranks[1].seq.life[idB].sampled)
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// P-05 through executors: with recompute pause off, A's failure at pass 10
// is fatal on both ranks in the same iteration.
func TestP05RecomputeDisabledFailsOnEveryRank(t *testing.T) {
	g := p03Rig(t, 6, false, false)
	g.drive(0)
	for _, rr := range g.ranks {
		require.ErrorIs(t, rr.err, scheduler.ErrHelixNoRecompute, "rank %d", rr.rank)
		require.ErrorContains(t, rr.err, "recompute pause is disabled")
		require.ErrorContains(t, rr.err, fmt.Sprintf("rank %d iteration 9:", rr.rank))
		require.Len(t, rr.snaps, 9)
	}
}

// P-07 through executors: the overlap loop. When A first fails, B is in the
// executing batch: A sits out (no error, B not paused). The next pass B is no
// longer executing: B is recompute-paused and A allocated. Outputs still
// equal the unconstrained run.
func TestP07OverlapExecutingVictimIsSpared(t *testing.T) {
	ref := p03Rig(t, 64, true, true)
	ref.drive(0)
	ref.requireNoErrors(t)
	g := p03Rig(t, 6, true, true)
	g.drive(0)
	g.requireNoErrors(t)
	g.requireEqualTraces(t)
	p0, p1 := g.ranks[0].plan.passes, g.ranks[1].plan.passes
	require.Equal(t, len(p0), len(p1))
	sat := -1
	for i := range p0 {
		require.Equal(t, p0[i].satOut, p1[i].satOut, "pass %d", i+1)
		require.Equal(t, p0[i].recomputed, p1[i].recomputed, "pass %d", i+1)
		require.Equal(t, p0[i].gen, p1[i].gen, "pass %d", i+1)
		require.Equal(t, p0[i].ctx, p1[i].ctx, "pass %d", i+1)
		if sat < 0 && len(p0[i].satOut) > 0 {
			sat = i
		}
	}
	require.GreaterOrEqual(t, sat, 0, "A must sit out once")
	require.Equal(t, []uint64{idA}, p0[sat].satOut)
	require.Empty(t, p0[sat].recomputed, "B is executing: not a victim")
	require.Contains(t, p0[sat].executing, idB)
	require.Empty(t, p0[sat].gen, "the sit-out is a STOP")
	next := p0[sat+1]
	require.NotContains(t, next.executing, idB)
	require.Equal(t, []uint64{idB}, next.recomputed)
	require.Equal(t, []uint64{idA}, next.gen)
	require.Empty(t, next.satOut)
	out, want := g.outputs(t), ref.outputs(t)
	for _, id := range []uint64{idA, idB} {
		require.Equal(t, want[id].Output, out[id].Output, "request %d", id)
	}
	g.requireNoLeaks(t)
}

// P-09 directly on two ledgers.
func TestP09FreeReturnsLedgerBlocksOnEveryRank(t *testing.T) {
	for rank := 0; rank < 2; rank++ {
		pool, err := kvpool.New(kvpool.Config{NumPages: 6, TokensPerPage: 4, CP: 2, CPRank: rank})
		require.NoError(t, err)
		r := asGeneration(t, pool, newRequest(arrival(1, 16, 20)))
		for i := 0; i < 8; i++ {
			require.True(t, pool.TryAllocateGeneration(&r.Request))
			pool.UpdateAfterGeneration(&r.Request)
		}
		require.Equal(t, 24, pool.Capacity(r.ID))
		require.Equal(t, 3, pool.FreePages())
		pool.Free(&r.Request)
		require.Equal(t, 6, pool.FreePages(), "rank %d: +3 pages", rank)
		require.NoError(t, pool.CheckInvariants())
	}
}

// P-10: the order of operations in the pass that recompute-pauses B:
// Schedule (B freed), the schedule check, terminate (the executor's cache
// probe for B: already freed, so no second free), reset, then canQueue and
// prepare. The reset is observed through B's fields: not yet reset at the
// check and at terminate, reset when prepare runs. (Under Helix canQueue
// enters no collective; it sits between the reset and prepareBatch, which is
// the first caller of IsActive after scheduling.) The reset takes no token
// cap: the executor always uses the full prompt (cap 0x7fffffff).
func TestP10OperationOrder(t *testing.T) {
	g := p03Rig(t, 6, false, true)
	ops := make([][]string, 2)
	for _, rr := range g.ranks {
		rr := rr
		armed := false
		state := func() string {
			b := rr.ex.byID[idB]
			if b.State == scheduler.ContextInit && b.PromptLen == 25 {
				return "reset"
			}
			return "live"
		}
		rr.plan.after = func(*scheduler.Output) {
			if len(rr.plan.passes) == 10 {
				armed = true
				ops[rr.rank] = append(ops[rr.rank], "schedule:B "+state())
			}
		}
		rr.hc.onEnter = func(name string) {
			if armed {
				ops[rr.rank] = append(ops[rr.rank], name+":B "+state())
			}
		}
		rr.kv.hook = func(op string, id uint64) {
			if !armed {
				return
			}
			switch {
			case op == "has_cache" && id == idB:
				ops[rr.rank] = append(ops[rr.rank], "terminate:B "+state())
			case op == "free" && id == idB:
				ops[rr.rank] = append(ops[rr.rank], "free:B "+state())
			case op == "is_active":
				ops[rr.rank] = append(ops[rr.rank], fmt.Sprintf("prepare(%d):B %s", id, state()))
				armed = false
			}
		}
	}
	g.drive(0)
	g.requireNoErrors(t)
	want := []string{"schedule:B live", "schedule_digest:B live", "terminate:B live", "prepare(0):B reset"}
	require.Equal(t, want, ops[0])
	require.Equal(t, want, ops[1])
	require.Equal(t, []uint64{idB}, g.ranks[0].plan.passes[9].recomputed)
}

// ---------------------------------------------------------------------------
// P-12, P-13: a request that never fits sits out until the stall is fatal
// ---------------------------------------------------------------------------

func TestP12StallIsFatalOnBothRanksSameIteration(t *testing.T) {
	g := (&rig{n: 2, helix: true, pages: 6, ppt: 4, sc: p03Sched(),
		src: allAtOnce(arrival(0, 16, 20))}).build(t)
	// Four of the six ledger blocks are held by something else (identically
	// on both ranks): A prefills into the last two and can never grow.
	for _, rr := range g.ranks {
		require.True(t, rr.pool.AddDummy(&scheduler.Request{ID: 1 << 62}, 16))
		require.Equal(t, 2, rr.pool.FreePages())
	}
	g.drive(0)
	for _, rr := range g.ranks {
		require.ErrorIs(t, rr.err, scheduler.ErrStalled, "rank %d", rr.rank)
		require.ErrorContains(t, rr.err, fmt.Sprintf("rank %d iteration 1000:", rr.rank), "the 1000th stalled pass")
		require.Len(t, rr.snaps, 1000)
		passes := rr.plan.passes
		require.Len(t, passes, 1000, "the failing pass returns no output")
		require.Equal(t, []uint64{idA}, passes[0].ctx)
		sitOuts := 0
		for i, p := range passes[1:] {
			// P-13: the sit-out is not a pause.
			require.Equal(t, []uint64{idA}, p.satOut, "pass %d", i+2)
			require.Empty(t, p.paused)
			require.Empty(t, p.recomputed)
			require.Empty(t, p.gen)
			require.Equal(t, i+1, p.stall)
			sitOuts++
		}
		notes := 0
		for _, n := range rr.notes {
			if strings.Contains(n.Text, "sitting out") {
				require.Equal(t, scheduler.LevelDebug, n.Level)
				notes++
			}
		}
		require.Equal(t, sitOuts, notes, "rank %d: one debug note per sit-out", rr.rank)
	}
	require.Equal(t, g.ranks[0].comm.Trace(), g.ranks[1].comm.Trace())
}

// P-13 directly: the sit-out clears the batch slot.
func TestP13SitOutClearsBatchIndex(t *testing.T) {
	var outs [2]string
	for rank := 0; rank < 2; rank++ {
		pool, err := kvpool.New(kvpool.Config{NumPages: 6, TokensPerPage: 4, CP: 2, CPRank: rank})
		require.NoError(t, err)
		require.True(t, pool.AddDummy(&scheduler.Request{ID: 1 << 62}, 16))
		r := asGeneration(t, pool, newRequest(arrival(1, 16, 20)))
		r.BatchIndex = 7
		sch, err := scheduler.New(p03Sched(), pool)
		require.NoError(t, err)
		out, err := sch.Schedule([]*scheduler.Request{&r.Request}, nil)
		require.NoError(t, err)
		require.Equal(t, scheduler.NoBatchIndex, r.BatchIndex)
		require.Equal(t, []uint64{1}, idsOf(out.SatOut))
		require.Empty(t, out.Paused)
		require.Empty(t, out.RecomputePaused)
		require.Zero(t, r.HelixDecodeCount, "no g committed")
		require.Equal(t, 16, pool.Capacity(r.ID), "capacity unchanged")
		sitting := 0
		for _, n := range out.Notes {
			if strings.Contains(n.Text, "sitting out") {
				require.Equal(t, scheduler.LevelDebug, n.Level)
				sitting++
			}
		}
		require.Equal(t, 1, sitting)
		outs[rank] = fmt.Sprint(idsOf(out.SatOut), out.StallCount, out.Notes)
	}
	require.Equal(t, outs[0], outs[1])
}

// ---------------------------------------------------------------------------
// P-21: a divergent schedule is caught right after Schedule
// ---------------------------------------------------------------------------

func TestP21DivergenceRaisedBeforeCanQueue(t *testing.T) {
	g := p03Rig(t, 64, false, true)
	// Rank 1's third pass claims a different recompute victim.
	g.ranks[1].plan.mutate = func(pass int, out *scheduler.Output) {
		if pass == 2 {
			out.RecomputePaused = append(out.RecomputePaused, out.Generation[1])
		}
	}
	prepared := [2]int{}
	for _, rr := range g.ranks {
		rr := rr
		rr.kv.hook = func(op string, _ uint64) {
			if op == "is_active" && len(rr.plan.passes) == 3 {
				prepared[rr.rank]++
			}
		}
	}
	g.drive(0)
	for _, rr := range g.ranks {
		require.True(t, errors.Is(rr.err, ErrScheduleDivergence), "rank %d: %v", rr.rank, rr.err)
		require.ErrorContains(t, rr.err, "at iteration 2")
		require.ErrorContains(t, rr.err, "recompute-paused ids differs: rank 0 [], rank 1 [1]")
		require.Equal(t, 2, rr.seq.steps, "no forward in the failing iteration")
		require.Equal(t, 0, prepared[rr.rank], "prepareBatch (after canQueue) never ran")
		require.Equal(t, idA, rr.ex.active[0].ID)
		require.Equal(t, scheduler.GenerationInProgress, rr.ex.byID[idB].State, "no reset before the check")
	}
	require.Equal(t, g.ranks[0].comm.Trace(), g.ranks[1].comm.Trace())
}
