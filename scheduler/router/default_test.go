package router

import (
	"testing"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnsetEstimateMatchesScheduler(t *testing.T) {
	require.Equal(t, scheduler.UnsetEstimate, UnsetEstimate)
}

// RS: retiring filter and the router's view of the rank state (§6.1). The
// wire rows (RS-05–08, RS-12, RS-13: 13-value serialization, the allgather
// and the stats slots) belong to the executor, which owns the wire format
// and converts it into RankState.
func TestRetiringFilterRS(t *testing.T) {
	retiring := func(s scheduler.State) bool { return s == scheduler.GenerationToComplete }
	t.Run("RS-01", func(t *testing.T) {
		kept, n := WithoutRetiring([]scheduler.State{}, retiring)
		assert.Empty(t, kept)
		assert.Equal(t, 0, n)
	})
	t.Run("RS-02", func(t *testing.T) {
		in := []scheduler.State{scheduler.GenerationToComplete, scheduler.GenerationToComplete, scheduler.GenerationToComplete}
		kept, n := WithoutRetiring(in, retiring)
		assert.Empty(t, kept)
		assert.Equal(t, 3, n)
	})
	t.Run("RS-03", func(t *testing.T) {
		in := []scheduler.State{scheduler.ContextInit, scheduler.ContextInProgress, scheduler.GenerationInProgress}
		kept, n := WithoutRetiring(in, retiring)
		assert.Equal(t, in, kept)
		assert.Equal(t, 0, n)
	})
	t.Run("RS-04", func(t *testing.T) {
		type req struct {
			name  string
			state scheduler.State
		}
		in := []req{{"keepA", scheduler.GenerationInProgress}, {"r1", scheduler.GenerationToComplete},
			{"keepB", scheduler.ContextInit}, {"r2", scheduler.GenerationToComplete}}
		orig := append([]req{}, in...)
		kept, n := WithoutRetiring(in, func(r req) bool { return retiring(r.state) })
		assert.Equal(t, []req{in[0], in[2]}, kept)
		assert.Equal(t, 2, n)
		assert.Equal(t, orig, in, "input untouched")
		kept[0].name = "changed"
		assert.Equal(t, "keepA", in[0].name, "a new list")
	})
	rows := []struct {
		id     string
		active []LoadEntry
		want   RankState
	}{
		{"RS-09", []LoadEntry{{PromptLen: 100}, {PromptLen: 200}}, RankState{Rank: 0, ActiveRequests: 2, ActiveTokens: 300}},
		{"RS-10", []LoadEntry{{PromptLen: 100}, {PromptLen: 200, Retiring: true}, {PromptLen: 300, Retiring: true}},
			RankState{ActiveRequests: 1, ActiveTokens: 100, RetiringRequests: 2}},
		{"RS-11", []LoadEntry{{PromptLen: 100, Retiring: true}, {PromptLen: 200, Retiring: true}},
			RankState{RetiringRequests: 2}},
		{"dummy never counted", []LoadEntry{{PromptLen: 7, Dummy: true}, {PromptLen: 5}},
			RankState{ActiveRequests: 1, ActiveTokens: 5}},
	}
	for _, row := range rows {
		t.Run(row.id, func(t *testing.T) {
			assert.Equal(t, row.want, LocalState(0, row.active))
		})
	}
}

// routeRow is one row of the DR, DF and DS tables.
type routeRow struct {
	id       string
	active   []int
	tokens   []int64 // nil: 10 × active
	capH     int
	pop      bool // run PopWaiting first (§4)
	items    []Item
	want     [][]uint64 // ids per rank in placement order; nil: not checked
	expected int        // -1: not checked
	putBack  []uint64   // with pop: ids left waiting
	check    func(t *testing.T, items []Item, res Result)
}

func runRouteRows(t *testing.T, rows []routeRow) {
	for _, row := range rows {
		t.Run(row.id, func(t *testing.T) {
			states := mkStates(row.active, row.tokens)
			items := row.items
			if row.pop {
				var rest []Item
				items, rest = PopWaiting(row.items, states, row.capH)
				assert.Equal(t, row.putBack, idsOrNil(rest), "left waiting")
			}
			res := newDefault(t, row.capH).Route(items, states)
			require.Len(t, res.Ranks, len(items))
			require.Len(t, res.Order, len(items))
			assert.Nil(t, res.Estimates, "the default router never publishes estimates")
			if row.want != nil {
				assert.Equal(t, row.want, perRank(items, res, len(states)))
			}
			if row.expected >= 0 {
				assert.Equal(t, row.expected, res.Expected)
			}
			if row.check != nil {
				row.check(t, items, res)
			}
		})
	}
}

func idsOrNil(items []Item) []uint64 {
	if len(items) == 0 {
		return nil
	}
	return ids(items)
}

// countsOf returns how many items each rank received.
func countsOf(res Result, dp int) []int {
	c := make([]int, dp)
	for _, r := range res.Ranks {
		c[r]++
	}
	return c
}

// DR: default router, basic (§6.2); requests of 10 tokens unless noted.
func TestDefaultRouterDR(t *testing.T) {
	spread := func(t *testing.T, _ []Item, res Result) {
		c := countsOf(res, 2)
		assert.LessOrEqual(t, max(c[0], c[1])-min(c[0], c[1]), 1)
	}
	runRouteRows(t, []routeRow{
		{id: "DR-01", active: []int{0, 0}, capH: 10, items: nil, want: [][]uint64{{}, {}}, expected: -1,
			check: func(t *testing.T, _ []Item, res Result) { assert.GreaterOrEqual(t, res.Expected, 0) }},
		{id: "DR-02", active: []int{0, 0}, capH: 10, items: nItems(4, 10), want: [][]uint64{{0, 2}, {1, 3}}, expected: 2, check: spread},
		{id: "DR-03", active: []int{0, 0}, capH: 10, items: []Item{item(0, 10, strict(1))}, want: [][]uint64{{}, {0}}, expected: -1},
		{id: "DR-04", active: []int{0, 2}, capH: 2, items: []Item{item(0, 10, strict(1))}, want: [][]uint64{{0}, {}}, expected: -1},
		{id: "DR-05", active: []int{0, 0}, capH: 1, items: []Item{item(0, 10, relaxed(0)), item(1, 10, strict(0))},
			want: [][]uint64{{1}, {0}}, expected: -1},
		{id: "DR-06", active: []int{3, 1}, tokens: []int64{300, 100}, capH: 100, items: nItems(4, 50),
			want: [][]uint64{{3}, {0, 1, 2}}, expected: 4},
		{id: "DR-07", active: []int{0}, capH: 10, items: nItems(5, 10), want: [][]uint64{{0, 1, 2, 3, 4}}, expected: 5},
		{id: "DR-08", active: []int{0, 0, 0, 0}, capH: 10, items: nItems(8, 10),
			want: [][]uint64{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, expected: 2},
	})
}

// DF: default router, fixed fleet (§6.3): 4 ranks, active [2,1,3,0],
// tokens [10,5,15,8], cap 8, requests of 3 tokens.
func TestDefaultRouterDF(t *testing.T) {
	tokens := []int64{10, 5, 15, 8}
	fleet := func(id string, items []Item, want [][]uint64, expected int) routeRow {
		return routeRow{id: id, active: []int{2, 1, 3, 0}, tokens: tokens, capH: 8, items: items, want: want, expected: expected}
	}
	r := func(id uint64, o ...opt) Item { return item(id, 3, o...) }
	rows := []routeRow{
		fleet("DF-01", []Item{r(0, strict(0)), r(1, strict(0))}, [][]uint64{{0, 1}, {}, {}, {}}, -1),
		fleet("DF-02", []Item{r(0, strict(1)), r(1, strict(2))}, [][]uint64{{}, {0}, {1}, {}}, -1),
		fleet("DF-03", []Item{r(0, relaxed(0)), r(1, relaxed(1))}, [][]uint64{{0}, {1}, {}, {}}, 3),
		{id: "DF-04", active: []int{8, 1, 3, 0}, tokens: tokens, capH: 8, items: []Item{r(0, relaxed(0))},
			want: [][]uint64{{}, {0}, {}, {}}, expected: 8},
		fleet("DF-05", []Item{r(0, strict(0)), r(1, strict(1)), r(2, relaxed(0)), r(3, relaxed(2))},
			[][]uint64{{0, 2}, {1}, {3}, {}}, -1),
		fleet("DF-06", nil, [][]uint64{{}, {}, {}, {}}, -1),
		// Trace: fair 3; 0 → r1 (5); 1 → r3 (8 = r1's 8, fewer requests);
		// 2 → r1 (8, count 3: full); 3 → r0 (10 < r3's 11).
		fleet("DF-07", []Item{r(0), r(1), r(2), r(3)}, [][]uint64{{3}, {0, 2}, {}, {1}}, 3),
		{id: "DF-08", active: []int{8, 1, 3, 0}, tokens: tokens, capH: 8, pop: true, items: []Item{r(0, strict(0))},
			want: [][]uint64{{}, {}, {}, {}}, expected: -1, putBack: []uint64{0}},
		fleet("DF-09", []Item{item(0, 4, strict(0)), item(1, 2, relaxed(0)), r(2)}, [][]uint64{{0, 1}, {2}, {}, {}}, 4),
		{id: "DF-10", active: []int{7, 1, 3, 0}, tokens: tokens, capH: 8, pop: true, items: []Item{r(0, strict(0)), r(1, strict(0))},
			want: [][]uint64{{0}, {}, {}, {}}, expected: -1, putBack: []uint64{1}},
	}
	runRouteRows(t, rows)

	t.Run("DF-11", func(t *testing.T) {
		var queue []Item
		for i := range 40 {
			o := strict(i / 2 % 4)
			if i%2 == 1 {
				o = relaxed(i / 2 % 4)
			}
			queue = append(queue, r(uint64(i), o))
		}
		states := mkStates([]int{5, 6, 3, 7}, nil)
		taken, rest := PopWaiting(queue, states, 8)
		assert.Len(t, taken, 11, "32 − 21")
		assert.Len(t, rest, 29)
		res := newDefault(t, 8).Route(taken, states)
		c := countsOf(res, 4)
		for rank, a := range []int{5, 6, 3, 7} {
			assert.LessOrEqual(t, a+c[rank], 8, "rank %d over the cap", rank)
		}
	})
}

// DS: default router, scheduling cases (§6.4): cap 3, 4 ranks, tokens
// [10,15,20,25], requests of 3 tokens, ids in queue order; every row pops.
func TestDefaultRouterDS(t *testing.T) {
	tokens := []int64{10, 15, 20, 25}
	row := func(id string, active []int, items []Item, want [][]uint64, expected int, putBack []uint64) routeRow {
		return routeRow{id: id, active: active, tokens: tokens, capH: 3, pop: true, items: items, want: want,
			expected: expected, putBack: putBack}
	}
	r := func(id uint64, o ...opt) Item { return item(id, 3, o...) }
	seq := func(a, b uint64) []uint64 {
		var out []uint64
		for i := a; i < b; i++ {
			out = append(out, i)
		}
		return out
	}
	runRouteRows(t, []routeRow{
		row("DS-01", []int{0, 0, 0, 0}, nItems(7, 3), [][]uint64{{0, 1}, {2, 3}, {4, 5}, {6}}, 2, nil),
		row("DS-02", []int{1, 2, 3, 0}, nItems(13, 3), [][]uint64{{0, 1}, {2}, {}, {3, 4, 5}}, 3, seq(6, 13)),
		// Trace of §6.4: 0→r0 13, 1→r0 16, 2→r1 18, 3→r0 19 (full), 4→r1 21,
		// 5→r2 23, 6→r1 24 (full), 7→r2 26, 8→r3 28, 9→r2 29 (full), 10→r3 31, 11→r3 34.
		row("DS-03", []int{0, 0, 0, 0}, nItems(13, 3), [][]uint64{{0, 1, 3}, {2, 4, 6}, {5, 7, 9}, {8, 10, 11}}, 3, []uint64{12}),
		row("DS-04", []int{3, 3, 3, 0}, nil, [][]uint64{{}, {}, {}, {}}, -1, nil),
		row("DS-05", []int{3, 1, 3, 0}, []Item{r(0, strict(0)), r(1, relaxed(0))}, [][]uint64{{}, {1}, {}, {}}, -1, []uint64{0}),
		row("DS-06", []int{3, 2, 3, 3}, []Item{r(0, strict(0)), r(1, relaxed(0))}, [][]uint64{{}, {1}, {}, {}}, -1, []uint64{0}),
		row("DS-07", []int{2, 1, 3, 0}, []Item{r(0, strict(1)), r(1, strict(3))}, [][]uint64{{}, {0}, {}, {1}}, -1, nil),
		row("DS-08", []int{3, 3, 3, 1}, []Item{r(0, relaxed(0)), r(1, relaxed(1)), r(2, relaxed(2))},
			[][]uint64{{}, {}, {}, {0, 1}}, -1, []uint64{2}),
		row("DS-09", []int{3, 3, 3, 0}, []Item{r(0, strict(0)), r(1, relaxed(1)), r(2, strict(3))},
			[][]uint64{{}, {}, {}, {2, 1}}, -1, []uint64{0}),
	})
}

// DB: the balancing step alone, with a given expected (§6.5). Request ids
// are 1-based as in the table (r1, r2, …).
func TestDefaultBalanceDB(t *testing.T) {
	rows := []struct {
		id       string
		active   []int
		tokens   []int64
		expected int
		prompts  []int
		want     [][]uint64
	}{
		{"DB-01", []int{2, 1, 3, 0}, []int64{20, 10, 30, 5}, 3, nil, [][]uint64{{}, {}, {}, {}}},
		{"DB-02", []int{1, 2, 0, 1}, []int64{10, 20, 5, 15}, 2, []int{5}, [][]uint64{{}, {}, {1}, {}}},
		{"DB-03", []int{0, 1, 2, 1}, []int64{5, 15, 25, 10}, 2, []int{3, 6, 2}, [][]uint64{{2, 3}, {}, {}, {1}}},
		{"DB-04", []int{1, 1, 1, 1}, []int64{10, 10, 10, 10}, 2, []int{1, 2, 3, 4}, [][]uint64{{4}, {3}, {2}, {1}}},
		{"DB-05", []int{3, 1, 0, 2}, []int64{30, 10, 5, 20}, 4, []int{3, 3, 3}, [][]uint64{{}, {3}, {1, 2}, {}}},
		{"DB-06", []int{0, 0, 0, 0}, []int64{5, 5, 5, 5}, 2, []int{1, 5, 3}, [][]uint64{{2}, {3}, {1}, {}}},
	}
	for _, row := range rows {
		t.Run(row.id, func(t *testing.T) {
			d := newDefault(t, 1000)
			dp := len(row.active)
			d.count = append([]int{}, row.active...)
			d.tokens = append([]int64{}, row.tokens...)
			var items []Item
			var rest []int
			for i, p := range row.prompts {
				items = append(items, item(uint64(i+1), p))
				rest = append(rest, i)
			}
			d.ranks = grow(d.ranks, len(items))
			d.balance(items, rest, row.expected)
			res := Result{Ranks: d.ranks, Order: d.placed}
			assert.Equal(t, row.want, perRank(items, res, dp))
		})
	}
}

// A state list in any gathered order routes the same: vectors are indexed
// by each state's Rank field, not by position.
func TestStatesIndexedByRankField(t *testing.T) {
	states := mkStates([]int{1, 2, 3, 0}, []int64{10, 15, 20, 25})
	shuffled := []RankState{states[2], states[0], states[3], states[1]}
	a := ownedCopy(newDefault(t, 3).Route(nItems(5, 3), states))
	b := ownedCopy(newDefault(t, 3).Route(nItems(5, 3), shuffled))
	assert.Equal(t, a, b)
	assert.Panics(t, func() { newDefault(t, 3).Route(nil, []RankState{{Rank: 0}, {Rank: 0}}) })
	assert.Panics(t, func() { newDefault(t, 3).Route(nil, []RankState{{Rank: 0}, {Rank: 2}}) })
}

func TestPopWaitingKeepsPutBacksFirst(t *testing.T) {
	states := mkStates([]int{3, 0}, nil)
	q := []Item{item(0, 1, strict(0)), item(1, 1), item(2, 1, strict(0)), item(3, 1), item(4, 1), item(5, 1)}
	taken, rest := PopWaiting(q, states, 3) // budget 3
	assert.Equal(t, []uint64{1, 3, 4}, ids(taken))
	assert.Equal(t, []uint64{0, 2, 5}, ids(rest))
	assert.Equal(t, uint64(0), q[0].ID, "waiting untouched")
}
