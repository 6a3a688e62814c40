package executor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLevelTarget: the cost-leveling rule's target and whether some rank
// defers its new prompts, case by case (three ranks; costs in equal-cost
// units: {mandatory, first chunks, the first of them}).
func TestLevelTarget(t *testing.T) {
	for _, c := range []struct {
		costs  []passCost
		target int64
		level  bool
		why    string
	}{
		{[]passCost{{100, 0, 0}, {80, 0, 0}, {50, 0, 0}}, 100, false, "no first chunk anywhere"},
		{[]passCost{{100, 10, 10}, {80, 30, 30}, {50, 5, 5}}, 100, false, "every rank has one: never held back"},
		{[]passCost{{100, 0, 0}, {80, 30, 10}, {50, 0, 0}}, 100, true, "rank 1 keeps 20 of its 30 (its first fits)"},
		{[]passCost{{100, 0, 0}, {80, 20, 10}, {50, 0, 0}}, 100, false, "all of rank 1's fit under T"},
		{[]passCost{{100, 40, 40}, {80, 0, 0}, {50, 0, 0}}, 100, false, "only the heaviest rank has a first chunk: none could keep one"},
		{[]passCost{{100, 40, 40}, {80, 30, 30}, {50, 0, 0}}, 100, false, "neither rank's first fits: the fleet would stall"},
		{[]passCost{{100, 40, 40}, {80, 30, 10}, {50, 0, 0}}, 100, true, "rank 1's first fits, rank 0 defers all"},
		{[]passCost{{0, 500, 500}, {0, 0, 0}, {0, 0, 0}}, 0, false, "an idle fleet: T = 0 forbids all, so nothing is held"},
	} {
		target, level := levelTarget(c.costs)
		require.Equal(t, c.target, target, c.why)
		require.Equal(t, c.level, level, c.why)
	}
	require.Equal(t, int64(10*(7+3+5)), chunkCost(7, 3, 10), "n·(O + p + n/2)")
}

// TestCostLevelingRun: with cost leveling on, three in-process ranks in
// both loops answer every request as with it off, some passes deferred new
// prompts and every rank counted the same passes; combined with ADP Balance
// it still answers alike.
func TestCostLevelingRun(t *testing.T) {
	reqs := sampleRequests(t, 64, 0.2)
	for _, overlap := range []bool{false, true} {
		base := (&fleet{ranks: 3, reqs: reqs, overlap: overlap}).mustRun(t)
		for _, b := range []ADPBalance{{CostLeveling: true, TimeoutIters: 50},
			{Enable: true, CostLeveling: true, TimeoutIters: 50, BatchingWaitIters: 10}} {
			f := (&fleet{ranks: 3, reqs: reqs, overlap: overlap, balance: b}).mustRun(t)
			require.Equal(t, base.digest(t), f.digest(t), "overlap %v, %+v: the same answers", overlap, b)
			leveled := f.results[0].CostLeveled
			require.Positive(t, leveled, "overlap %v, %+v", overlap, b)
			var cut int64
			for _, r := range f.results {
				cut += r.CostLevelCut
			}
			t.Logf("overlap %v, %+v: %d passes leveled, %d first chunks cut", overlap, b, leveled, cut)
			for _, r := range f.results {
				require.Equal(t, leveled, r.CostLeveled, "every rank made the same decisions")
				require.Equal(t, f.results[0].ADPBalanceHeld, r.ADPBalanceHeld)
			}
		}
	}
}

// TestCutChunk: a first chunk that does not fit the room is cut to the most
// whole units that do; one that fits, or a room below one unit, is not cut.
func TestCutChunk(t *testing.T) {
	for _, c := range []struct {
		o         int64
		pos, n, u int
		room      int64
		want      int
		why       string
	}{
		{0, 0, 512, 64, 64 * 32, 64, "one unit at depth 0 costs 64·32"},
		{0, 0, 512, 64, 64*32 - 1, 0, "a room below one unit: deferred"},
		{0, 0, 512, 64, 256 * 128, 256, "256 tokens cost 256·128"},
		{0, 0, 512, 64, 512*256 + 5, 448, "the whole chunk would fit but is never cut to itself: whole units below it"},
		{100, 1000, 300, 32, 96 * (100 + 1000 + 48), 96, "depth and offset count: 96·(100+1000+48)"},
		{0, 0, 64, 64, 1 << 40, 0, "a chunk of one unit cannot be cut"},
		{0, 0, 512, 0, 1 << 40, 0, "no unit (chunking off): never cut"},
		{0, 0, 512, 64, 0, 0, "no room"},
	} {
		require.Equal(t, c.want, cutChunk(c.o, c.pos, c.n, c.u, c.room), c.why)
		if c.want > 0 && c.want+c.u < c.n {
			require.LessOrEqual(t, chunkCost(c.o, c.pos, c.want), c.room, c.why)
			require.Greater(t, chunkCost(c.o, c.pos, c.want+c.u), c.room, "%s: one unit more does not fit", c.why)
		}
	}
}

// TestCostLevelingCuts: with longer prompts some ranks cut a first chunk to
// the room the heaviest rank's mandatory work leaves, and the answers are
// still those of a run without leveling (a cut chunk's rest runs as a
// continuation).
func TestCostLevelingCuts(t *testing.T) {
	reqs := sampleRequests(t, 64, 1)
	for _, overlap := range []bool{false, true} {
		base := (&fleet{ranks: 4, reqs: reqs, overlap: overlap, pages: 512}).mustRun(t)
		f := (&fleet{ranks: 4, reqs: reqs, overlap: overlap, pages: 512,
			balance: ADPBalance{CostLeveling: true, TimeoutIters: 50}}).mustRun(t)
		require.Equal(t, base.digest(t), f.digest(t), "overlap %v: the same answers", overlap)
		var cut int64
		for _, r := range f.results {
			cut += r.CostLevelCut
		}
		require.Positive(t, cut, "overlap %v: some first chunk was cut", overlap)
	}
}
