package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// configDM is the demotion default of spec §18.18: chunking on, M = 8 192,
// u = 64, U = 32 768, K = 0, equal-cost off.
func configDM(k int64) Config {
	c := baseConfig()
	c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 64, 8192
	c.Demotion = Demotion{UncachedTokens: 32768, MaxIters: k}
	return c
}

// longReq is L(est, rem): a first chunk with that estimate and remaining.
func longReq(id uint64, est int64, rem int) *Request { return withEst(ctx(id, rem), est) }

// short is S(est): a first chunk with remaining = est.
func short(id uint64, est int) *Request { return withEst(ctx(id, est), int64(est)) }

type dmCase struct {
	name    string
	cfg     Config
	list    []*Request
	kv      func(*fakeKV)
	order   []uint64 // Context order of the output
	chunks  []int    // chunks in output order
	demoted []uint64
}

// Spec §18.18: long-prefill demotion, single-pass rows.
func TestDemotion(t *testing.T) {
	off := configDM(0)
	off.Demotion.UncachedTokens = 0
	nonChunked := configDM(0)
	nonChunked.ChunkedContext = false
	nonChunked.Demotion.UncachedTokens = 4096
	u4096 := configDM(0)
	u4096.Demotion.UncachedTokens = 4096
	withCost := configDM(0)
	withCost.EqualCost = EqualCost{KVOffset: 35000, KVDepthThreshold: 250000}

	for _, tc := range []dmCase{
		{name: "DM-01", cfg: off, list: []*Request{longReq(0, 200000, 200000), short(1, 1000)}, order: []uint64{0}, chunks: []int{8192}},
		{name: "DM-02", cfg: configDM(0), list: []*Request{longReq(0, 200000, 200000), short(1, 1000)},
			order: []uint64{0, 1}, chunks: []int{7168, 1000}, demoted: []uint64{0}},
		{name: "DM-03", cfg: nonChunked, list: []*Request{longReq(0, 8000, 8000), short(1, 1000)}, order: []uint64{0}, chunks: []int{8000}},
		{name: "DM-04", cfg: u4096, list: []*Request{longReq(0, 8000, 8000), short(1, 1000)},
			order: []uint64{0, 1}, chunks: []int{7168, 1000}, demoted: []uint64{0}},
		{name: "DM-05", cfg: configDM(0), list: []*Request{ctx(0, 200000), short(1, 1000)}, order: []uint64{0}, chunks: []int{8192}},
		{name: "DM-06", cfg: configDM(0), list: []*Request{longReq(0, 200000, 200000)}, order: []uint64{0}, chunks: []int{8192}, demoted: []uint64{0}},
		{name: "DM-07", cfg: configDM(0), list: []*Request{longReq(0, 100000, 100000), short(1, 2000), longReq(2, 50000, 50000), short(3, 3000)},
			order: []uint64{0, 1, 3}, chunks: []int{3136, 2000, 3000}, demoted: []uint64{0, 2}},
		{name: "DM-08", cfg: configDM(0), list: []*Request{withEst(cont(0, 30000), 200000), short(1, 1000)}, order: []uint64{0}, chunks: []int{8192}},
		{name: "DM-09", cfg: configDM(0), list: []*Request{withEst(cont(0, 40000), 40000), short(1, 1000)},
			order: []uint64{0, 1}, chunks: []int{7168, 1000}, demoted: []uint64{0}},
		{name: "DM-10", cfg: configDM(0), list: []*Request{longReq(0, 40000, 40000), short(1, 1000)},
			kv: func(f *fakeKV) { f.reuseLen[0] = 39000 }, order: []uint64{1, 0}, chunks: []int{1000, 1000}, demoted: []uint64{0}},
		{name: "DM-13", cfg: withCost, list: []*Request{withEst(contAt(0, 900000, 96608), 96608), short(1, 4000)},
			order: []uint64{0, 1}, chunks: []int{2304, 4000}, demoted: []uint64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeKV()
			if tc.kv != nil {
				tc.kv(f)
			}
			f.register(tc.list)
			f.log = nil
			s := mustNew(t, tc.cfg, f)
			out, err := s.Schedule(tc.list, nil)
			require.NoError(t, err)
			require.Equal(t, tc.order, ids(out.Context))
			require.Equal(t, tc.chunks, chunks(out.Context))
			if tc.demoted == nil {
				require.Empty(t, out.Demoted)
			} else {
				require.Equal(t, tc.demoted, out.Demoted)
			}
			if tc.name == "DM-02" {
				// Scheduling order was [S, L]: S is prepared first.
				require.Equal(t, []string{"Prepare(1)", "Resize(1,1000)", "Prepare(0)", "Resize(0,7168)"}, f.log)
			}
			if tc.name == "DM-13" {
				require.Equal(t, int64(2294240000), out.CostUsed)
			}
		})
	}
}

// schedule runs one pass or fails the test.
func schedule(t *testing.T, s *Scheduler, list []*Request, exec ...uint64) *Output {
	t.Helper()
	out, err := s.Schedule(list, exec)
	require.NoError(t, err)
	return out
}

// Spec §18.18: the aging counter across passes (DM-11, DM-14 … DM-18).
func TestDemotionCounters(t *testing.T) {
	t.Run("DM-11", func(t *testing.T) {
		c := configDM(5)
		c.SchedulerCapacity = 2
		f := newFakeKV()
		list := []*Request{longReq(0, 100000, 100000), short(1, 1000), short(2, 1000)}
		s := mustNew(t, c, f)
		out := schedule(t, s, list)
		require.Equal(t, []uint64{1, 2}, ids(out.Context))
		n, ok := s.DemotionCount(0)
		require.True(t, ok)
		require.Equal(t, int64(1), n)
	})
	t.Run("DM-14", func(t *testing.T) {
		f := newFakeKV()
		s := mustNew(t, configDM(1), f)
		l := longReq(0, 100000, 100000)
		out := schedule(t, s, []*Request{l, short(1, 8192)})
		require.Equal(t, []uint64{1}, ids(out.Context))
		n, _ := s.DemotionCount(0)
		require.Equal(t, int64(1), n)

		f.resizeFn = resizeFailIDs(0) // pass 2: let through but its resize fails
		out = schedule(t, s, []*Request{l, short(2, 8192)})
		require.Equal(t, []uint64{2}, ids(out.Context), "L let through, fails, S2 backfills")
		require.Empty(t, out.Demoted)
		n, _ = s.DemotionCount(0)
		require.Equal(t, int64(1), n, "let through, not scheduled: unchanged")

		f.resizeFn = nil
		out = schedule(t, s, []*Request{l, short(3, 8192)})
		require.Equal(t, []uint64{0}, ids(out.Context))
		require.Equal(t, 8192, l.ChunkSize)
		_, ok := s.DemotionCount(0)
		require.False(t, ok, "let through and scheduled: deleted")
	})
	t.Run("DM-15", func(t *testing.T) {
		s := mustNew(t, configDM(2), newFakeKV())
		schedule(t, s, []*Request{longReq(0, 100000, 100000), short(1, 8192)})
		require.Equal(t, 1, s.DemotionEntries())
		schedule(t, s, []*Request{short(2, 100)}) // L cancelled
		require.Zero(t, s.DemotionEntries())
	})
	t.Run("DM-16", func(t *testing.T) {
		f := newFakeKV()
		s := mustNew(t, configDM(3), f)
		l := longReq(0, 100000, 100000)
		s.demote.counts[0] = demoteEntry{count: 3}
		out := schedule(t, s, []*Request{l, short(1, 4000)})
		require.Equal(t, 8192, l.ChunkSize, "let through in pass k")
		require.Equal(t, []uint64{0}, ids(out.Context))
		require.Zero(t, s.DemotionEntries())
		l.ContextPosition += l.ChunkSize
		l.State = ContextInProgress
		out = schedule(t, s, []*Request{l, short(2, 1000)}, 0) // overlap: L executing
		require.Equal(t, []uint64{0}, out.Demoted)
		n, _ := s.DemotionCount(0)
		require.Equal(t, int64(1), n)
	})
	t.Run("DM-17", func(t *testing.T) {
		s := mustNew(t, configDM(0), newFakeKV())
		l := longReq(0, 100000, 100000)
		for pass := 0; pass < 10; pass++ {
			out := schedule(t, s, []*Request{l, short(uint64(pass+1), 8192)})
			require.Equal(t, []uint64{0}, out.Demoted)
			require.Zero(t, l.ChunkSize)
			require.Zero(t, s.DemotionEntries())
		}
	})
	t.Run("DM-18", func(t *testing.T) {
		f := newFakeKV()
		f.allocFn = allocNever
		list := []*Request{short(0, 1000), gen(1), longReq(2, 100000, 100000)}
		f.register(list)
		s := mustNew(t, configDM(2), f)
		s.demote.counts[2] = demoteEntry{count: 1, idx: 2}
		out := schedule(t, s, list)
		require.Equal(t, []uint64{0}, ids(out.Context))
		require.Equal(t, 1000, list[0].ChunkSize)
		require.Empty(t, out.Demoted)
		n, _ := s.DemotionCount(2)
		require.Equal(t, int64(1), n, "behind the phase-1 STOP: unchanged")
	})
	t.Run("sweep after the list shifts", func(t *testing.T) {
		s := mustNew(t, configDM(5), newFakeKV())
		a, l := short(1, 8192), longReq(2, 100000, 100000)
		schedule(t, s, []*Request{a, l})
		schedule(t, s, []*Request{l}) // a finished: L moved from index 1 to 0
		n, ok := s.DemotionCount(2)
		require.True(t, ok)
		require.Equal(t, int64(2), n)
		require.Equal(t, int32(0), s.demote.counts[2].idx)
	})
}
