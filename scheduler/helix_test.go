package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// helixSetup builds an aggregated-Helix scheduler (cp = 2, P = 4, ledger
// block 8) whose gen0 allocation fails unless gen1's cache was freed.
func helixSetup(t *testing.T, recompute bool, list ...*Request) (*Scheduler, *fakeKV, []*Request) {
	f := newFakeKV()
	f.P, f.helix = 4, true
	f.allocFn = func(_ int, r *Request) bool { return r.ID != 0 || f.count("Free(1)") > 0 }
	f.register(list)
	c := baseConfig()
	c.Helix, c.LedgerBlockTokens, c.RecomputePause = true, 8, recompute
	return mustNew(t, c, f), f, list
}

// Spec §18.15: Helix scheduler cases.
func TestHelix(t *testing.T) {
	t.Run("T-HX-01", func(t *testing.T) {
		s, f, list := helixSetup(t, true, gen(0), gen(1))
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{1}, ids(out.RecomputePaused))
		require.Equal(t, []uint64{0}, ids(out.Generation))
		require.Equal(t, 1, list[0].HelixDecodeCount)
		require.Empty(t, out.SatOut)
		require.Zero(t, f.count("Suspend"))
	})
	t.Run("T-HX-02", func(t *testing.T) {
		g := gen(0)
		g.BatchIndex = 3
		s, f, list := helixSetup(t, true, g)
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{0}, ids(out.SatOut))
		require.Empty(t, out.Paused)
		require.Empty(t, out.Generation)
		require.Equal(t, NoBatchIndex, g.BatchIndex)
		require.Zero(t, f.count("Suspend"), "no self-eviction under Helix")
		require.Equal(t, []Note{{Level: LevelDebug, Text: "helix: request 0 found no free KV pages and no preemptible request; sitting out this step"},
			{Level: LevelDebug, Text: "scheduler made no progress in this pass (1 active requests)"}}, out.Notes)
		require.Zero(t, g.HelixDecodeCount)
	})
	t.Run("T-HX-02 STOP", func(t *testing.T) {
		// The sit-out is a STOP: a context behind it is not reached.
		s, _, list := helixSetup(t, true, gen(0), ctx(1, 10))
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{0}, ids(out.SatOut))
		require.Empty(t, out.Context)
	})
	t.Run("T-HX-03", func(t *testing.T) {
		s, _, list := helixSetup(t, false, gen(0))
		_, err := s.Schedule(list, nil)
		require.ErrorIs(t, err, ErrHelixNoRecompute)
		require.ErrorContains(t, err, "recompute pause is disabled")
		require.ErrorContains(t, err, "request 0")
	})
	t.Run("T-HX-04", func(t *testing.T) {
		s, f, list := helixSetup(t, true, gen(0), gen(1))
		f.host = true // wrongly claimed
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Zero(t, f.count("Suspend"))
		require.Equal(t, []uint64{1}, ids(out.RecomputePaused))
	})
	preempt := func(helix bool, list ...*Request) (bool, []uint64) {
		f := newFakeKV()
		f.register(list)
		c := baseConfig()
		c.Helix = helix
		s := mustNew(t, c, f)
		s.begin(list, nil)
		ok := s.preemptForPages(1)
		return ok, ids(s.out.RecomputePaused)
	}
	t.Run("T-HX-05", func(t *testing.T) {
		ok, v := preempt(true, cont(10, 50), ctx(11, 50), cont(12, 50))
		require.True(t, ok)
		require.Equal(t, []uint64{12}, v)
		ok, v = preempt(false, cont(10, 50), ctx(11, 50), cont(12, 50))
		require.True(t, ok)
		require.Equal(t, []uint64{12}, v)
	})
	t.Run("T-HX-06", func(t *testing.T) {
		ok, v := preempt(true, cont(10, 50), ctx(11, 50))
		require.False(t, ok)
		require.Empty(t, v)
		ok, v = preempt(false, cont(10, 50), ctx(11, 50))
		require.True(t, ok)
		require.Equal(t, []uint64{10}, v)
	})
	t.Run("T-HX-07", func(t *testing.T) {
		s, _, list := helixSetup(t, true, gen(0), gen(1))
		out, err := s.Schedule(list, []uint64{1})
		require.NoError(t, err)
		require.Equal(t, []uint64{0}, ids(out.SatOut))
		require.Empty(t, out.RecomputePaused)
		out, err = s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{1}, ids(out.RecomputePaused))
		require.Equal(t, []uint64{0}, ids(out.Generation))
		require.Empty(t, out.SatOut)
	})
	t.Run("context preemption behind only", func(t *testing.T) {
		// A newest context request never preempts under Helix and waits (SKIP).
		f := newFakeKV()
		f.resizeFn = resizeFailIDs(1)
		list := []*Request{cont(0, 100), ctx(1, 100)}
		f.register(list)
		c := baseConfig()
		c.Helix, c.ChunkedContext, c.ChunkUnitSize = true, true, 8
		s := mustNew(t, c, f)
		f.resizeFn = func(_ int, r *Request, _ int) bool { return r.ID != 1 }
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{0}, ids(out.Context))
		require.Empty(t, out.RecomputePaused)
	})
}
