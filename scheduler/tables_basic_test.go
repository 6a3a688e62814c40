package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Spec §18.3: token and request budgets.
func TestTokenAndRequestBudgets(t *testing.T) {
	runRows(t, []row{
		{name: "T-TOK-01", cfg: tokens(3), list: gens(0, 5), gen: seq(0, 3)},
		{name: "T-TOK-02", cfg: tokens(100), list: []*Request{ctx(0, 200)}},
		{name: "T-TOK-03", cfg: tokens(110), list: []*Request{gen(0), ctx(1, 100)}, gen: []uint64{0}, ctx: []uint64{1}},
		{name: "T-TOK-04", cfg: tokens(Unlimited), list: gens(0, 10), gen: seq(0, 10)},
		{name: "T-TOK-05", cfg: tokens(3), list: gens(0, 3), gen: seq(0, 3)},
		{name: "T-TOK-06", cfg: func(c *Config) { c.MaxBatchSize = 2 }, list: gens(0, 3), gen: seq(0, 2)},
		{name: "T-TOK-07", cfg: func(c *Config) { c.MaxBatchSize = 3; c.MaxNumTokens = 2 }, list: gens(0, 5), gen: seq(0, 2)},
		{name: "T-TOK-08", cfg: tokens(1000), list: []*Request{ctx(0, 600), ctx(1, 500), ctx(2, 300)}, ctx: []uint64{0},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Zero(t, f.count("Prepare(2)"), "ctx2 is behind the STOP and never tried")
			}},
		{name: "T-TOK-09", cfg: all(tokens(1000), chunked(64)), list: []*Request{ctx(0, 600), ctx(1, 500), ctx(2, 300)},
			ctx: []uint64{1, 0}, chunks: []int{384, 600},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Zero(t, f.count("Prepare(2)"), "16 < u: cheap SKIP without a KV call")
			}},
		{name: "T-TOK-10", kv: func(f *fakeKV) { f.allocFn = allocNever },
			list: []*Request{ctx(0, 100), gen(1), ctx(2, 100)}, ctx: []uint64{0}, paused: []uint64{1}},
		{name: "T-TOK-11", cfg: tokens(0), list: []*Request{gen(0)}},
		{name: "T-TOK-12", cfg: func(c *Config) { c.MaxBatchSize = 0 }, list: []*Request{gen(0), ctx(1, 10)}},
		{name: "T-TOK-13", cfg: func(c *Config) { c.MaxBatchSize = 2000; c.MaxNumTokens = 2000 }, list: gens(0, 1000), gen: seq(0, 1000)},
	})
}

// allocCalls asserts the number of TryAllocateGeneration calls.
func allocCalls(n int) func(*testing.T, *fakeKV, *Scheduler, *Output) {
	return func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
		require.Equal(t, n, f.allocCalls, "TryAllocateGeneration calls")
	}
}

// Spec §18.4: generation allocation failures (the ladder of §11).
func TestGenerationLadder(t *testing.T) {
	three := func() []*Request { return []*Request{gen(0), gen(1), gen(99)} }
	runRows(t, []row{
		{name: "T-GEN-01", list: gens(0, 3), gen: seq(0, 3)},
		{name: "T-GEN-02", kv: func(f *fakeKV) { f.allocFn = allocOK(1) }, list: []*Request{gen(0), gen(1), ctx(2, 10)},
			gen: []uint64{0}, paused: []uint64{1}, check: allocCalls(2)},
		{name: "T-GEN-03", kv: func(f *fakeKV) { host(f); f.allocFn = allocFail(2) }, list: three(),
			gen: []uint64{0, 1}, paused: []uint64{99}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Suspend(99)"}, f.log)
				require.Equal(t, 3, f.allocCalls)
			}},
		{name: "T-GEN-04", kv: func(f *fakeKV) { host(f); f.allocFn = allocOK(1, 4) }, list: three(),
			gen: []uint64{0, 1}, recompute: []uint64{99}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Suspend(99)", "Free(99)"}, f.log)
				require.Equal(t, 4, f.allocCalls)
			}},
		{name: "T-GEN-05", cfg: func(c *Config) { c.RecomputePause = false }, kv: func(f *fakeKV) { host(f); f.allocFn = allocOK(1) },
			list: three(), gen: []uint64{0}, paused: []uint64{99, 1}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Zero(t, f.count("Free"))
				require.Equal(t, 3, f.allocCalls)
			}},
		{name: "T-GEN-06", kv: func(f *fakeKV) { host(f); f.allocFn = allocOK(1) }, list: three(),
			gen: []uint64{0}, paused: []uint64{1}, recompute: []uint64{99}, check: allocCalls(4)},
		{name: "T-GEN-07", kv: func(f *fakeKV) { f.allocFn = allocOK(1) }, list: three(),
			gen: []uint64{0}, paused: []uint64{1}, recompute: []uint64{99}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Free(99)", "Suspend(1)"}, f.log)
				require.Equal(t, 3, f.allocCalls)
			}},
		{name: "T-GEN-08", kv: func(f *fakeKV) { f.allocFn = allocNever; f.setSuspended(1, 10) },
			list: []*Request{gen(0), withState(gen(1), GenerationToComplete)}, paused: []uint64{0}},
		{name: "T-GEN-09", kv: func(f *fakeKV) {
			host(f)
			f.setSuspended(3, 10)
			tries0 := 0
			f.allocFn = func(_ int, r *Request) bool {
				switch r.ID {
				case 0:
					tries0++
					return tries0 == 2
				case 1:
					return !f.HasCache(3)
				}
				return true
			}
		}, list: gens(0, 4), gen: []uint64{0, 1}, paused: []uint64{2}, recompute: []uint64{3},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Suspend(2)", "Free(3)"}, f.log)
			}},
		// Issue 9, defect 12: with a host tier, a suspended request whose
		// every page is on the host frees no device page; recompute-pausing
		// it would only lose its KV. It is skipped and gen0 self-evicts
		// (before the fix: recompute [1], then the self-eviction anyway).
		{name: "T-GEN-09b", kv: func(f *fakeKV) {
			host(f)
			f.setSuspended(1, 10)
			f.caches[1].onHost = true
			f.allocFn = allocNever
		}, list: []*Request{gen(0), gen(1)}, paused: []uint64{0},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Zero(t, f.count("Free"))
				require.True(t, f.HasCache(1))
			}},
		{name: "T-GEN-11", kv: func(f *fakeKV) {
			f.setSuspended(1, 10)
			f.allocFn = func(_ int, r *Request) bool { return !f.HasCache(1) }
		}, list: []*Request{gen(0), gen(1), ctx(2, 10)}, gen: []uint64{0}, recompute: []uint64{1}, ctx: []uint64{2},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []uint64{0, 0}, f.allocIDs)
			}},
		{name: "T-GEN-12", kv: func(f *fakeKV) { host(f); f.allocFn = allocFail(2, 3) },
			list: []*Request{gen(0), gen(1), gen(98), gen(99)}, gen: []uint64{0, 1}, paused: []uint64{99, 98}},
		{name: "T-GEN-13", kv: func(f *fakeKV) { f.allocFn = allocFail(2, 3) },
			list: []*Request{gen(0), gen(1), gen(98), gen(99)}, gen: []uint64{0, 1}, recompute: []uint64{99, 98}},
		{name: "T-GEN-14", kv: func(f *fakeKV) { f.allocFn = allocOK(1) }, list: gens(0, 2), gen: []uint64{0}, paused: []uint64{1}},
		{name: "T-GEN-15", cfg: func(c *Config) { c.RecomputePause = false },
			kv:   func(f *fakeKV) { host(f); f.allocFn = allocOK(1); f.setSuspended(99, 10) },
			list: three(), gen: []uint64{0}, paused: []uint64{1}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Zero(t, f.count("Suspend(99)"))
			}},
		{name: "T-GEN-16", kv: func(f *fakeKV) { f.allocFn = allocFail(2) }, list: gens(0, 3), exec: []uint64{2},
			gen: []uint64{0}, paused: []uint64{1}, check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []uint64{0, 1}, f.allocIDs, "gen2 is behind the STOP")
			}},
	})
}

// T-GEN-10: a direct rung-2 call exercising the fallback to Paused.
func TestRung2Fallback(t *testing.T) {
	f := newFakeKV()
	f.host = true
	list := []*Request{gen(0), gen(1)}
	f.setSuspended(0, 10)
	f.setActive(1, 10)
	s := mustNew(t, baseConfig(), f)
	s.begin(list, nil)
	s.end, s.frontier = 1, 1
	s.out.Paused = append(s.out.Paused, list[0])
	s.pausedIdx = append(s.pausedIdx, 0)
	s.flags[0] |= flagPaused

	require.True(t, s.rung2(1))
	require.Equal(t, 1, s.end)
	require.Empty(t, s.out.Paused)
	require.Equal(t, []uint64{0}, ids(s.out.RecomputePaused))
	require.Equal(t, 0, s.frontier)
	require.NotZero(t, s.flags[0]&flagVictim)
	require.Zero(t, s.flags[1]&flagVictim)
	require.Equal(t, []string{"Free(0)"}, f.log)
	require.Equal(t, 1, f.allocCalls)
}

// T-GEN-17: the executing set changes between passes.
func TestExecutingVictimNextPass(t *testing.T) {
	f := newFakeKV()
	list := gens(0, 3)
	f.register(list)
	f.allocFn = allocFail(2)
	s := mustNew(t, baseConfig(), f)
	out, err := s.Schedule(list, []uint64{2})
	require.NoError(t, err)
	require.Equal(t, []uint64{1}, ids(out.Paused))

	// Pass 2: gen0 is executing, gen1 is suspended and fails once, gen2 is free to be a victim.
	f.resetCounts()
	failed := false
	f.allocFn = func(_ int, r *Request) bool {
		if r.ID == 1 && !failed {
			failed = true
			return false
		}
		return true
	}
	out, err = s.Schedule(list, []uint64{0})
	require.NoError(t, err)
	require.Equal(t, []uint64{0, 1}, ids(out.Generation))
	require.Equal(t, []uint64{2}, ids(out.RecomputePaused))
	require.Empty(t, out.Paused)
}

// Spec §18.5: eviction details (host tier, M = 100 unless noted).
func TestEvictionDetails(t *testing.T) {
	m := tokens(100)
	hostAnd := func(fn func(int, *Request) bool) func(*fakeKV) {
		return func(f *fakeKV) { host(f); f.allocFn = fn }
	}
	withBatch := gen(0)
	withBatch.BatchIndex = 7
	runRows(t, []row{
		{name: "T-EVI-01", cfg: m, kv: hostAnd(allocFail(1)), list: []*Request{gen(0), gen(99)}, gen: []uint64{0}, paused: []uint64{99},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Suspend(99)"}, f.log)
			}},
		{name: "T-EVI-02", cfg: m, kv: hostAnd(allocFail(1)), list: []*Request{gen(0), cont(99, 100)}, gen: []uint64{0}, paused: []uint64{99}},
		{name: "T-EVI-03", cfg: m, kv: hostAnd(allocNever), list: []*Request{gen(0), ctx(99, 10)}, paused: []uint64{0}},
		{name: "T-EVI-04", cfg: m, kv: hostAnd(allocNever), list: []*Request{withBatch}, paused: []uint64{0},
			check: func(t *testing.T, _ *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, NoBatchIndex, withBatch.BatchIndex)
			}},
		{name: "T-EVI-05", cfg: m, kv: hostAnd(allocOK(3)), list: []*Request{gen(0), gen(98), gen(99)}, gen: []uint64{0}, paused: []uint64{99, 98}},
		{name: "T-EVI-06", cfg: m, kv: hostAnd(allocFail(1)), list: []*Request{gen(0), gen(5), ctx(6, 10)}, gen: []uint64{0}, paused: []uint64{5}},
		{name: "T-EVI-07", cfg: m, kv: hostAnd(allocNever), list: []*Request{gen(0)}, paused: []uint64{0}},
		{name: "T-EVI-08", cfg: tokens(200), kv: hostAnd(allocNever), list: []*Request{gen(0), ctx(1, 50), ctx(2, 50)}, paused: []uint64{0}},
		{name: "T-EVI-09", cfg: m, kv: func(f *fakeKV) { f.allocFn = allocFail(1) }, list: []*Request{gen(0), gen(99)},
			gen: []uint64{0}, recompute: []uint64{99}},
	})
}

// Spec §18.8: state window and executing set.
func TestStateWindow(t *testing.T) {
	runRows(t, []row{
		{name: "T-STA-01", list: []*Request{withState(gen(0), GenerationToComplete)}},
		{name: "T-STA-02", list: []*Request{withState(gen(0), Complete)}},
		{name: "T-STA-03", cfg: tokens(1000), list: []*Request{ctx(0, 100)}, ctx: []uint64{0}},
		{name: "T-STA-04", list: []*Request{gen(0)}, gen: []uint64{0}},
		{name: "T-STA-05", list: []*Request{withState(gen(0), Complete), withState(gen(1), GenerationToComplete)}},
		{name: "T-STA-06", list: gens(0, 2), exec: []uint64{0}, gen: []uint64{0, 1}},
		{name: "T-STA-07", list: []*Request{withState(gen(0), GenerationToComplete), gen(1), withState(gen(2), Complete), ctx(3, 100)},
			gen: []uint64{1}, ctx: []uint64{3}},
	})
}

// Spec §18.9: mixed ordering.
func TestMixedOrdering(t *testing.T) {
	gen0Fails := func(_ int, r *Request) bool { return r.ID != 0 }
	runRows(t, []row{
		{name: "T-MIX-01", cfg: tokens(300), list: []*Request{gen(0), ctx(1, 100), gen(2), ctx(3, 100)},
			gen: []uint64{0, 2}, ctx: []uint64{1, 3}},
		{name: "T-MIX-02", kv: func(f *fakeKV) { f.resizeFn = resizeFailIDs(0) }, list: []*Request{ctx(0, 500), gen(1)}, gen: []uint64{1}},
		{name: "T-MIX-03", kv: func(f *fakeKV) { f.allocFn = allocNever }, list: []*Request{gen(0), ctx(1, 100)}, paused: []uint64{0}},
		{name: "T-MIX-04", cfg: tokens(102), list: []*Request{gen(0), ctx(1, 100), gen(2)}, gen: []uint64{0, 2}, ctx: []uint64{1}},
		{name: "T-MIX-05", cfg: tokens(100), kv: func(f *fakeKV) { f.resizeFn = resizeFailIDs(0) },
			list: []*Request{ctx(0, 50), gen(1)}, gen: []uint64{1}},
		{name: "T-MIX-06", kv: func(f *fakeKV) { f.allocFn = gen0Fails }, list: gens(0, 3), paused: []uint64{0}, recompute: []uint64{2, 1}},
		{name: "T-MIX-07", kv: func(f *fakeKV) { host(f); f.allocFn = gen0Fails }, list: gens(0, 3), paused: []uint64{0}, recompute: []uint64{2, 1},
			check: func(t *testing.T, f *fakeKV, _ *Scheduler, _ *Output) {
				require.Equal(t, []string{"Suspend(2)", "Suspend(1)", "Free(2)", "Free(1)", "Suspend(0)"}, f.log)
			}},
		{name: "T-MIX-08", cfg: func(c *Config) { c.RecomputePause = false }, kv: func(f *fakeKV) { f.allocFn = gen0Fails },
			list: gens(0, 3), paused: []uint64{0}},
	})
}

// Spec §18.12 and §18.13: sorting and the output record.
func TestSortingAndOutput(t *testing.T) {
	var gen06 = []*Request{gen(0), gen(1), gen(99)}
	runRows(t, []row{
		{name: "T-SRT-01", list: gens(0, 3), gen: seq(0, 3)},
		{name: "T-SRT-02", cfg: all(tokens(600), chunked(64)), list: []*Request{ctx(0, 100), ctx(1, 1000)},
			ctx: []uint64{1, 0}, chunks: []int{448, 100},
			check: func(t *testing.T, _ *fakeKV, _ *Scheduler, out *Output) {
				require.Equal(t, []int{448, 100}, out.Charged)
			}},
		{name: "T-SRT-03", list: []*Request{ctx(0, 100), ctx(1, 200)}, ctx: []uint64{0, 1}},
		{name: "T-OUT-01", cfg: tokens(1000), list: []*Request{gen(0), ctx(1, 100)}, gen: []uint64{0}, ctx: []uint64{1}},
		{name: "T-OUT-02", list: []*Request{ctx(0, 100), ctx(1, 100), gen(2), gen(3), gen(4)}, gen: []uint64{2, 3, 4}, ctx: []uint64{0, 1},
			check: func(t *testing.T, _ *fakeKV, _ *Scheduler, out *Output) { require.Equal(t, 5, out.NumFitting) }},
		{name: "T-OUT-03", list: nil, check: func(t *testing.T, _ *fakeKV, _ *Scheduler, out *Output) {
			require.Zero(t, out.NumFitting)
			require.Zero(t, out.StallCount)
		}},
		{name: "T-OUT-04", kv: func(f *fakeKV) { host(f); f.allocFn = allocOK(1) }, list: gen06,
			gen: []uint64{0}, paused: []uint64{1}, recompute: []uint64{99}},
	})
}
