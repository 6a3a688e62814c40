package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Configurations of spec §9.6.
func configA() Config {
	c := baseConfig()
	c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 64, 8192
	c.EqualCost = EqualCost{KVOffset: 35000, KVDepthThreshold: 250000}
	return c
}

func configB() Config {
	c := configA()
	c.MaxNumTokens = 1024
	c.EqualCost = EqualCost{KVOffset: 1000, KVDepthThreshold: 1000}
	return c
}

func configC() Config {
	c := configA()
	c.EqualCost.PerChunkDepthTokens = 3000
	return c
}

// pr is a context request at KV depth p (a first chunk whose reused prefix
// is p tokens) with rem tokens left.
type pr struct{ p, rem int }

// deep builds the list; ids are 0, 1, 2, … in list order.
func deep(f *fakeKV, reqs ...pr) []*Request {
	var list []*Request
	for i, q := range reqs {
		id := uint64(i)
		f.reuseLen[id] = q.p
		list = append(list, ctx(id, q.p+q.rem))
	}
	return list
}

// ecPass runs one pass and returns the chunk of every request in list order
// (0 = not scheduled) and the output.
func ecPass(t *testing.T, cfg Config, f *fakeKV, list []*Request) ([]int, *Output) {
	t.Helper()
	f.register(list)
	s := mustNew(t, cfg, f)
	out, err := s.Schedule(list, nil)
	require.NoError(t, err)
	got := make([]int, len(list))
	for _, r := range out.Context {
		for i, x := range list {
			if x == r {
				got[i] = r.ChunkSize
			}
		}
	}
	return got, out
}

type ecCase struct {
	name   string
	cfg    Config
	reqs   []pr
	chunks []int
	used   int64 // -1: unchecked
}

func runEC(t *testing.T, cases []ecCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeKV()
			got, out := ecPass(t, tc.cfg, f, deep(f, tc.reqs...))
			require.Equal(t, tc.chunks, got, "chunks")
			if tc.used >= 0 {
				require.Equal(t, tc.used, out.CostUsed, "cost used")
			}
		})
	}
}

const bA = 2334720000

// Spec §9.6: the worked examples W1–W7 and W9–W12 (W8 and W13 are multi-pass,
// see TestEqualCostWholePrompt).
func TestEqualCostWorkedExamples(t *testing.T) {
	runEC(t, []ecCase{
		{"W1", configA(), []pr{{0, 100000}}, []int{8192}, 286720000},
		{"W2", configA(), []pr{{250000, 100000}}, []int{8192}, bA},
		{"W3", configA(), []pr{{900000, 96608}}, []int{2496}, 2333760000},
		{"W4", configA(), []pr{{900000, 96608}, {0, 100000}}, []int{2496, 0}, 2333760000},
		{"W5", configA(), []pr{{900000, 96608}, {0, 20}}, []int{2496, 20}, 2334460000},
		{"W6", configA(), []pr{{500000, 200000}, {0, 3000}}, []int{4352, 128}, 2328320000 + 35000*128},
		{"W7/300k", configA(), []pr{{300000, 100000}}, []int{6912}, -1},
		{"W7/500k", configA(), []pr{{500000, 100000}}, []int{4352}, -1},
		{"W7/750k", configA(), []pr{{750000, 100000}}, []int{2944}, -1},
		{"W7/990k", configA(), []pr{{990000, 100000}}, []int{2240}, -1},
		{"W7/1200k", configA(), []pr{{1200000, 100000}}, []int{2048}, -1},
		{"W9", configB(), []pr{{40000, 5000}, {0, 500}}, []int{256, 0}, 10496000},
		{"W10", configB(), []pr{{0, 300}, {40000, 5000}}, []int{300, 0}, 300000},
		{"W11", configC(), []pr{{250000, 100000}}, []int{8192}, 3084720000},
		{"W12", configC(), []pr{{900000, 96608}}, []int{2048}, 4614880000},
	})
}

// Spec §18.17: equal-cost chunking (single-pass rows).
func TestEqualCost(t *testing.T) {
	noCost := configA()
	noCost.EqualCost = EqualCost{}
	onlyO := configA()
	onlyO.EqualCost.KVDepthThreshold = 0
	m1000 := configB()
	m1000.MaxNumTokens = 1000
	runEC(t, []ecCase{
		{"EC-01", noCost, []pr{{900000, 96608}}, []int{8192}, 0},
		{"EC-02", onlyO, []pr{{900000, 96608}}, []int{8192}, 0},
		{"EC-05", configA(), []pr{{0, 100000}}, []int{8192}, 286720000},
		{"EC-06", configA(), []pr{{250000, 100000}}, []int{8192}, bA},
		{"EC-07", configA(), []pr{{900000, 96608}}, []int{2496}, 2333760000},
		{"EC-08", configA(), []pr{{1200000, 500000}}, []int{2048}, 2529280000},
		{"EC-09", configA(), []pr{{900000, 96608}, {0, 100000}, {0, 20}}, []int{2496, 0, 20}, 2334460000},
		{"EC-10", configA(), []pr{{500000, 200000}, {0, 3000}}, []int{4352, 128}, -1},
		{"EC-11", configB(), []pr{{40000, 5000}, {0, 500}}, []int{256, 0}, 10496000},
		{"EC-12", configB(), []pr{{0, 300}, {40000, 5000}}, []int{300, 0}, 300000},
		{"EC-16", configC(), []pr{{0, 100000}}, []int{8192}, 286720000},
		{"EC-17", configC(), []pr{{250000, 100000}}, []int{8192}, 3084720000},
		{"EC-18", configC(), []pr{{900000, 96608}}, []int{2048}, 4614880000},
		{"EC-19", configC(), []pr{{500000, 200000}, {10000, 3000}, {0, 3000}}, []int{2944, 0, 256}, 3075040000 + 35000*256},
		{"EC-20", m1000, []pr{{40000, 5000}}, []int{192}, 41000 * 192},
	})

	t.Run("EC-03", func(t *testing.T) {
		c := configA()
		c.ChunkedContext = false
		f := newFakeKV()
		got, out := ecPass(t, c, f, deep(f, pr{900000, 8000}))
		require.Equal(t, []int{8000}, got)
		require.Zero(t, out.CostBudget)
	})
	t.Run("EC-04", func(t *testing.T) {
		c := configA()
		c.MaxNumTokens = Unlimited
		f := newFakeKV()
		got, out := ecPass(t, c, f, deep(f, pr{900000, 96608}))
		require.Equal(t, []int{96608}, got)
		require.Zero(t, out.CostBudget)
		_, on := mustNew(t, c, f).CostBudget()
		require.False(t, on)
	})
	t.Run("EC-13", func(t *testing.T) {
		c := configA()
		c.MaxBatchSize = 8000
		f := newFakeKV()
		list := gens(0, 7000)
		f.reuseLen[7000] = 1200000
		list = append(list, ctx(7000, 1700000))
		got, out := ecPass(t, c, f, list)
		require.Len(t, out.Generation, 7000)
		require.Equal(t, 1152, got[7000])
	})
	t.Run("EC-14", func(t *testing.T) {
		f := newFakeKV()
		f.resizeFn = resizeFailIDs(0)
		got, _ := ecPass(t, configA(), f, deep(f, pr{900000, 96608}, pr{1200000, 500000}))
		require.Equal(t, []int{0, 2048}, got)
	})
	t.Run("EC-15", func(t *testing.T) {
		f := newFakeKV()
		list := append(gens(100, 150), ctx(0, 1000))
		got, out := ecPass(t, configA(), f, list)
		require.Equal(t, 1000, got[50])
		require.Len(t, out.Generation, 50)
		require.Equal(t, int64(35000000), out.CostUsed)
	})
	t.Run("EC-22", func(t *testing.T) {
		c := configA()
		c.CostMode = CostAuto
		f := newFakeKV()
		got, out := ecPass(t, c, f, deep(f, pr{900000, 96608}))
		require.Equal(t, []int{8192}, got, "no cap before the first publication")
		require.Zero(t, out.CostBudget)

		// After a publication the cap binds like configuration A.
		f2 := newFakeKV()
		list := deep(f2, pr{900000, 96608})
		f2.register(list)
		s := mustNew(t, c, f2)
		require.Contains(t, s.Describe(), "equal-cost=auto(waiting for calibration)")
		require.NoError(t, s.PublishCost(35000, 250000))
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, 2496, out.Context[0].ChunkSize)
		require.Equal(t, int64(bA), out.CostBudget)
		require.Error(t, mustNew(t, configA(), f2).PublishCost(1, 1), "manual/off modes refuse publications")
	})
}

// EC-21, W8 and W13: one 996 608-token prompt from p = 0, alone, over
// repeated passes.
func TestEqualCostWholePrompt(t *testing.T) {
	passes := func(cfg Config, floor int64) int {
		f := newFakeKV()
		r := ctx(0, 996608)
		list := []*Request{r}
		s := mustNew(t, cfg, f)
		if floor > 0 {
			s.SetCostFloor(floor)
		}
		n := 0
		for r.Remaining() > 0 {
			out, err := s.Schedule(list, nil)
			require.NoError(t, err)
			require.Len(t, out.Context, 1, "pass %d at p = %d", n+1, r.ContextPosition)
			r.ContextPosition += r.ChunkSize
			r.State = ContextInProgress
			n++
		}
		return n
	}
	tokenOnly := configA()
	tokenOnly.EqualCost = EqualCost{}
	require.Equal(t, 243, passes(configA(), 0), "W8 / EC-21 with R = 0")
	require.Equal(t, 122, passes(tokenOnly, 0), "W8: token budget only")
	require.Equal(t, 320, passes(configC(), 0), "W13 / EC-21 with R = 3 000")
	require.Equal(t, 1064, passes(configC(), 64), "W13: one-unit floor (reference)")
}
