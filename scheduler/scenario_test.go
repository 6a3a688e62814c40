package scheduler_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/sim"
)

// gneSetup is spec §18.16: P = 4, no reuse, chunking off, non-overlap; A, B,
// C arrive together: A and B prompt 12, MaxNewTokens 8; C prompt 4, MaxNewTokens 4.
func gneSetup(t *testing.T, policy scheduler.Policy, pages int) (*sim.Sim, *scheduler.FakeKV) {
	t.Helper()
	f := scheduler.NewFakeKV()
	f.SetPool(4, pages, false)
	c := scheduler.DefaultConfig()
	c.MaxBatchSize, c.MaxNumTokens, c.LedgerBlockTokens, c.Policy = 100, 1024, 4, policy
	s, err := scheduler.New(c, f)
	require.NoError(t, err)
	sm, err := sim.New(s, f, []sim.Spec{
		{ID: 'A', PromptLen: 12, MaxNewTokens: 8, UncachedEstimate: -1},
		{ID: 'B', PromptLen: 12, MaxNewTokens: 8, UncachedEstimate: -1},
		{ID: 'C', PromptLen: 4, MaxNewTokens: 4, UncachedEstimate: -1},
	})
	require.NoError(t, err)
	return sm, f
}

func ctxIDs(rec sim.Record) []uint64 {
	out := []uint64{}
	for _, c := range rec.Context {
		out = append(out, c.ID)
	}
	return out
}

// Spec §18.16: capacity policies.
func TestCapacityPolicies(t *testing.T) {
	t.Run("T-GNE-01..03,08", func(t *testing.T) {
		sm, f := gneSetup(t, scheduler.GuaranteedNoEvict, 9)
		rec, _, err := sm.Step()
		require.NoError(t, err)
		require.Equal(t, []uint64{'A'}, ctxIDs(rec), "T-GNE-01: B does not fit 9 − 5 = 4, C is not tried")
		require.Equal(t, 9-3-2, f.Available())
		for pass := 2; pass <= 8; pass++ {
			rec, _, err = sm.Step()
			require.NoError(t, err)
			require.Equal(t, []uint64{'A'}, rec.Generation, "T-GNE-02 pass %d", pass)
			require.Empty(t, rec.Context)
			require.Empty(t, rec.Suspended)
			require.Empty(t, rec.RecomputePaused)
		}
		require.Equal(t, []uint64{'A'}, rec.Finished)
		require.Equal(t, 9, f.Available(), "T-GNE-08: the reservation is released with the cache")
		rec, _, err = sm.Step()
		require.NoError(t, err)
		require.Equal(t, []uint64{'B', 'C'}, ctxIDs(rec), "T-GNE-03")
	})
	t.Run("T-GNE-04", func(t *testing.T) {
		sm, _ := gneSetup(t, scheduler.MaxUtilization, 9)
		rec, _, err := sm.Step()
		require.NoError(t, err)
		require.Equal(t, []uint64{'A', 'B', 'C'}, ctxIDs(rec))
		rec, _, err = sm.Step()
		require.NoError(t, err)
		require.Equal(t, []uint64{'A', 'B'}, rec.Generation)
		require.Equal(t, []uint64{'C'}, rec.Suspended)
		finished := map[uint64]bool{}
		for i := 0; i < 100 && !sm.Done(); i++ {
			rec, _, err = sm.Step()
			require.NoError(t, err)
			for _, id := range rec.Finished {
				finished[id] = true
			}
		}
		require.True(t, sm.Done())
		require.Len(t, finished, 3)
	})
	t.Run("T-GNE-05", func(t *testing.T) {
		a, _ := gneSetup(t, scheduler.GuaranteedNoEvict, 20)
		b, _ := gneSetup(t, scheduler.MaxUtilization, 20)
		for pass := 1; !a.Done() || !b.Done(); pass++ {
			require.Less(t, pass, 100)
			ra, _, err := a.Step()
			require.NoError(t, err)
			rb, _, err := b.Step()
			require.NoError(t, err)
			require.Equal(t, ra.Context, rb.Context, "pass %d", pass)
			require.Equal(t, ra.Generation, rb.Generation, "pass %d", pass)
			require.Empty(t, ra.Suspended)
			require.Empty(t, rb.Suspended)
			require.Empty(t, ra.RecomputePaused)
			require.Empty(t, rb.RecomputePaused)
		}
	})
	t.Run("T-GNE-07", func(t *testing.T) {
		r := &scheduler.Request{PromptLen: 30, MaxNewTokens: 20}
		require.Equal(t, 13, scheduler.PagesToCompletion(r, 4), "13 > 9: the executor rejects it on arrival")
	})
}

// DM-12: K = 2; L(100 000) arrived first; one new S(8 192) with
// MaxNewTokens 1 arrives every pass.
func TestDemotionAgingSequence(t *testing.T) {
	f := scheduler.NewFakeKV()
	c := scheduler.DefaultConfig()
	c.MaxBatchSize, c.MaxNumTokens, c.LedgerBlockTokens = 100, 8192, 64
	c.ChunkedContext, c.ChunkUnitSize = true, 64
	c.Demotion = scheduler.Demotion{UncachedTokens: 32768, MaxIters: 2}
	s, err := scheduler.New(c, f)
	require.NoError(t, err)
	const L = 1000
	specs := []sim.Spec{{ID: L, PromptLen: 100000, MaxNewTokens: 4, UncachedEstimate: 100000}}
	for k := 1; k <= 40; k++ {
		specs = append(specs, sim.Spec{ID: uint64(k), Arrive: k - 1, PromptLen: 8192, MaxNewTokens: 1, UncachedEstimate: 8192})
	}
	sm, err := sim.New(s, f, specs)
	require.NoError(t, err)

	var lPasses []int
	for pass := 1; pass <= 31; pass++ {
		rec, _, err := sm.Step()
		require.NoError(t, err)
		var lChunk int
		for _, ch := range rec.Context {
			if ch.ID == L {
				lChunk = ch.Chunk
				lPasses = append(lPasses, pass)
			}
		}
		n, ok := s.DemotionCount(L)
		switch {
		case pass <= 27 && pass%3 == 0:
			require.Equal(t, 8192, lChunk, "pass %d: let through", pass)
			require.False(t, ok, "pass %d: entry deleted", pass)
		case pass <= 27:
			require.Zero(t, lChunk, "pass %d", pass)
			require.Equal(t, int64(2-pass%3%2), n, "pass %d", pass) // 1 after the first demoted pass of a cycle, 2 after the second
			require.Equal(t, []uint64{L}, rec.Demoted)
		case pass <= 30:
			require.Equal(t, 8192, lChunk, "pass %d: NORMAL, first in FCFS", pass)
			require.Empty(t, rec.Demoted)
		default:
			require.Equal(t, 1696, lChunk, "pass 31: last chunk")
			require.Equal(t, []sim.Chunk{{ID: 19, Chunk: 6464, Position: 0}, {ID: L, Chunk: 1696, Position: 98304}}, rec.Context)
		}
	}
	require.Equal(t, []int{3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}, lPasses)
}
