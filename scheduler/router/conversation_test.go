package router

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// homeOf returns the rank bound to key without touching it.
func homeOf(t *testing.T, c *Conversation, key string) int {
	t.Helper()
	r, ok := c.bind.peek(key)
	require.True(t, ok, "key %q is not bound", key)
	return int(r)
}

// CR: conversation-aware router (§6.6): 4 ranks, cap 1 000, state tokens
// 10 × active, round-robin unless noted.
func TestConversationRouterCR(t *testing.T) {
	idle := mkStates([]int{0, 0, 0, 0}, nil)
	convs := func(names ...string) []Item {
		out := make([]Item, len(names))
		for i, n := range names {
			out[i] = item(uint64(i), 10)
			if n != "-" {
				out[i].ConversationID = n
			}
		}
		return out
	}

	t.Run("CR-01/CR-02", func(t *testing.T) {
		c := newConv(t, Config{})
		items := convs("conv0", "conv1", "conv2", "conv3")
		res := c.Route(items, idle)
		assert.Equal(t, []int{0, 1, 2, 3}, res.Ranks)
		assert.Equal(t, 2, res.Expected, "max(ceil(2 · 1), 0)")
		res = c.Route(items, idle) // CR-02: the same conversations again
		assert.Equal(t, []int{0, 1, 2, 3}, res.Ranks)
	})
	t.Run("CR-03", func(t *testing.T) {
		c := newConv(t, Config{})
		res := c.Route(nItems(8, 10), idle)
		assert.Equal(t, []int{0, 1, 2, 3, 0, 1, 2, 3}, res.Ranks, "cursor order")
		assert.Equal(t, 4, res.Expected)
		assert.Equal(t, 0, c.bind.len())
		assert.Equal(t, []int{2, 2, 2, 2}, countsOf(res, 4))
	})
	t.Run("CR-04", func(t *testing.T) {
		items := convs("A", "B", "C", "-", "A", "B", "E", "-", "C")
		a := ownedCopy(newConv(t, Config{}).Route(items, idle))
		b := ownedCopy(newConv(t, Config{}).Route(items, idle))
		assert.Equal(t, a, b)
		assert.Equal(t, []int{0, 1, 2, 3, 0, 1, 0, 1, 2}, a.Ranks)
	})
	t.Run("CR-05", func(t *testing.T) {
		c := newConv(t, Config{MaxSessions: 2})
		c.Route(convs("c0", "c1", "c2", "c3", "c4"), mkStates([]int{0, 0}, nil))
		assert.ElementsMatch(t, []string{"c3", "c4"}, c.bind.keys())
	})
	t.Run("CR-06", func(t *testing.T) {
		c := newConv(t, Config{})
		r1 := c.Route([]Item{item(0, 10, conv("A"), strict(2))}, idle)
		r2 := c.Route([]Item{item(1, 10, conv("A"))}, idle)
		assert.Equal(t, 2, r1.Ranks[0])
		assert.Equal(t, 2, r2.Ranks[0])
		assert.Equal(t, 2, homeOf(t, c, "A"))
	})
	t.Run("CR-07", func(t *testing.T) {
		c := newConv(t, Config{})
		c.Route([]Item{item(0, 10, conv("A"), strict(2))}, idle)
		res := c.Route([]Item{item(1, 10, conv("A"), strict(1))}, idle)
		assert.Equal(t, 2, res.Ranks[0], "home beats target")
		assert.Equal(t, 2, homeOf(t, c, "A"))
	})
	t.Run("CR-08", func(t *testing.T) {
		c := newConv(t, Config{MaxActivePerRank: 5})
		two := mkStates([]int{0, 0}, nil)
		require.Equal(t, 0, c.Route([]Item{item(0, 10, conv("A"))}, two).Ranks[0])
		res := c.Route([]Item{item(1, 10, conv("A"))}, mkStates([]int{5, 0}, nil))
		assert.Equal(t, 1, res.Ranks[0])
		assert.Equal(t, 0, homeOf(t, c, "A"), "a full home is not rebound")
	})
	t.Run("CR-09", func(t *testing.T) {
		assert.Equal(t, RankState{Rank: 2, ActiveRequests: 2, ActiveTokens: 150},
			LocalState(2, []LoadEntry{{PromptLen: 100}, {PromptLen: 50}}))
	})
	t.Run("CR-10", func(t *testing.T) {
		assert.Equal(t, RankState{ActiveRequests: 1, ActiveTokens: 100, RetiringRequests: 1},
			LocalState(0, []LoadEntry{{PromptLen: 100}, {PromptLen: 50, Retiring: true}}))
	})
	t.Run("CR-11", func(t *testing.T) {
		r, err := New(NameFor(true), Config{MaxActivePerRank: 10, MaxSessions: 8})
		require.NoError(t, err)
		c, ok := r.(*Conversation)
		require.True(t, ok)
		assert.Equal(t, 8, c.bind.capacity)
		assert.False(t, c.leastQueued, "round-robin by default")
		assert.Empty(t, c.Notes())
	})
	t.Run("CR-12", func(t *testing.T) {
		c := newConv(t, Config{NewConvPlacement: PlacementLeastQueued})
		res := c.Route([]Item{item(0, 10, conv("A"))}, mkStates([]int{5, 1, 3, 4}, nil))
		assert.Equal(t, 1, res.Ranks[0])
		assert.Equal(t, 1, homeOf(t, c, "A"))
	})
	t.Run("CR-13", func(t *testing.T) {
		c := newConv(t, Config{NewConvPlacement: PlacementLeastQueued})
		res := c.Route(convs("A", "B", "C", "D"), mkStates([]int{3, 0, 2, 3}, nil))
		assert.Equal(t, 6, res.Expected, "max(ceil(2 · 3), 3)")
		assert.Equal(t, []int{0, 3, 1, 0}, countsOf(res, 4))
	})
	t.Run("CR-14", func(t *testing.T) {
		c := newConv(t, Config{NewConvPlacement: PlacementLeastQueued, MaxActivePerRank: 100})
		require.Equal(t, 1, c.Route([]Item{item(0, 10, conv("A"))}, mkStates([]int{2, 0, 1, 1}, nil)).Ranks[0])
		res := c.Route([]Item{item(1, 10, conv("A"))}, mkStates([]int{0, 9, 0, 0}, nil))
		assert.Equal(t, 1, res.Ranks[0], "sticky")
	})
	t.Run("CR-15", func(t *testing.T) {
		items := convs("A", "B", "-", "A", "C", "-", "B")
		states := mkStates([]int{2, 5, 0, 1}, nil)
		cfg := Config{NewConvPlacement: PlacementLeastQueued}
		a := ownedCopy(newConv(t, cfg).Route(items, states))
		b := ownedCopy(newConv(t, cfg).Route(items, states))
		assert.Equal(t, a, b)
		assert.Equal(t, []int{2, 2, 3, 2, 0, 3, 2}, a.Ranks)
	})
	t.Run("least_tokens", func(t *testing.T) {
		// Issue 25 item 6: a new conversation goes to the rank with the fewest
		// prompt tokens under the bound (ties: fewer requests, then the lowest
		// rank), counting the prompts placed earlier in the same call; a
		// bound key still goes home.
		c := newConv(t, Config{NewConvPlacement: PlacementLeastTokens, MaxActivePerRank: 100})
		require.True(t, c.leastTokens)
		require.Empty(t, c.Notes())
		states := mkStates([]int{1, 3, 2, 2}, []int64{900, 300, 500, 300})
		res := c.Route([]Item{item(0, 400, conv("A")), item(1, 100, conv("B")), item(2, 50, conv("C"))}, states)
		// A: ranks 1 and 3 tie at 300 tokens with 3 and 2 requests: rank 3
		// (→ 700); B: rank 1 (300 → 400); C: rank 1 (400 < 500).
		assert.Equal(t, []int{3, 1, 1}, ownedCopy(res).Ranks)
		res = c.Route([]Item{item(3, 10, conv("A"))}, mkStates([]int{0, 0, 0, 9}, []int64{0, 0, 0, 5000}))
		assert.Equal(t, 3, res.Ranks[0], "sticky beats balance")
		// The fair-share bound still holds: a rank at the expected count is
		// passed over even with the fewest tokens.
		c = newConv(t, Config{NewConvPlacement: PlacementLeastTokens, MaxActivePerRank: 100, FairShareMultiplier: 1})
		res = c.Route([]Item{item(4, 10, conv("D"))}, mkStates([]int{5, 1}, []int64{10, 900}))
		assert.Equal(t, 1, res.Ranks[0], "rank 0 is at the expected count (5): passed over")
	})
	t.Run("least_prefill", func(t *testing.T) {
		// A new conversation goes to the rank with the fewest prompt tokens
		// still to prefill (PendingPrefill, not ActiveTokens), counting the
		// prompts placed earlier in the same call; ties as least_tokens.
		c := newConv(t, Config{NewConvPlacement: PlacementLeastPrefill, MaxActivePerRank: 100})
		require.True(t, c.leastPrefill)
		require.Empty(t, c.Notes())
		r, err := New(NameConversation, Config{MaxActivePerRank: 10, NewConvPlacement: PlacementLeastPrefill})
		require.NoError(t, err)
		assert.True(t, ReadsPendingPrefill(r))
		for _, p := range []string{PlacementRoundRobin, PlacementLeastQueued, PlacementLeastTokens} {
			r, err := New(NameConversation, Config{MaxActivePerRank: 10, NewConvPlacement: p})
			require.NoError(t, err)
			assert.False(t, ReadsPendingPrefill(r), p)
		}
		d, err := New(NameDefault, Config{MaxActivePerRank: 10, NewConvPlacement: PlacementLeastPrefill})
		require.NoError(t, err)
		assert.False(t, ReadsPendingPrefill(d), "the default router places by count")

		// Rank 0 has the fewest prompt tokens but the most left to prefill:
		// least_tokens would pick it, least_prefill does not.
		states := mkStates([]int{2, 2, 2, 3}, []int64{100, 900, 800, 700})
		for r, p := range []int64{5000, 200, 200, 0} {
			states[r].PendingPrefill = p
		}
		res := c.Route([]Item{item(0, 300, conv("A")), item(1, 100, conv("B")), item(2, 150, conv("C"))}, states)
		// A: rank 3 (0 → 300); B: ranks 1 and 2 tie at 200 with 2 requests
		// each: rank 1 (→ 300); C: rank 2 (200).
		assert.Equal(t, []int{3, 1, 2}, ownedCopy(res).Ranks)
		lt := newConv(t, Config{NewConvPlacement: PlacementLeastTokens, MaxActivePerRank: 100})
		assert.Equal(t, 0, lt.Route([]Item{item(0, 300, conv("A"))}, states).Ranks[0], "least_tokens: rank 0")
		res = c.Route([]Item{item(3, 10, conv("A"))}, mkStates([]int{0, 0, 0, 9}, nil))
		assert.Equal(t, 3, res.Ranks[0], "sticky beats balance")
	})
	t.Run("load_balance_weight", func(t *testing.T) {
		// With a weight w > 0 a returning conversation goes to the rank
		// minimising w·tokens + the prompt it must prefill there (at home
		// only the growth since its previous turn), and that rank becomes
		// its home; w = 0 is the spec's sticky rule.
		states := func(prefill ...int64) []RankState {
			s := mkStates([]int{1, 1, 1, 1}, nil)
			for r, p := range prefill {
				s[r].PendingPrefill = p
			}
			return s
		}
		for _, tc := range []struct {
			name    string
			w       float64
			prefill []int64
			want    int
		}{
			// Turn 2 of A: prompt 1 100, 100 of it new (uncached at home).
			{"off: home whatever its load", 0, []int64{0, 50_000, 0, 0}, 1},
			{"home busy: leaves", 1, []int64{0, 50_000, 0, 0}, 0},               // 0 + 1 100 < 50 000 + 100
			{"home lightly loaded: stays", 1, []int64{0, 500, 0, 0}, 1},         // 500 + 100 < 0 + 1 100
			{"tie keeps home", 1, []int64{0, 1_000, 0, 0}, 1},                   // 1 000 + 100 = 0 + 1 100
			{"small weight: the cache wins", 0.01, []int64{0, 50_000, 0, 0}, 1}, // 500 + 100 < 1 100
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := newConv(t, Config{NewConvPlacement: PlacementLeastPrefill, MaxActivePerRank: 100, LoadBalanceWeight: tc.w})
				// Turn 1 of A (1 000 tokens) lands on rank 1, the only rank
				// without pending prefill.
				first := c.Route([]Item{item(0, 1000, conv("A"))}, states(9, 0, 9, 9))
				require.Equal(t, 1, first.Ranks[0])
				res := c.Route([]Item{item(1, 1100, conv("A"))}, states(tc.prefill...))
				require.Equal(t, tc.want, res.Ranks[0])
				assert.Equal(t, tc.want, homeOf(t, c, "A"), "the chosen rank is A's home now")
			})
		}
		// The fair-share bound holds for the ranks it may move to: with
		// multiplier 1 every other rank is at the expected count.
		c := newConv(t, Config{NewConvPlacement: PlacementLeastTokens, MaxActivePerRank: 100, LoadBalanceWeight: 1,
			FairShareMultiplier: 1})
		require.Equal(t, 1, c.Route([]Item{item(0, 1000, conv("A"))}, mkStates([]int{3, 0, 3, 3}, []int64{9, 0, 9, 9})).Ranks[0])
		res := c.Route([]Item{item(1, 1100, conv("A"))}, mkStates([]int{1, 0, 1, 1}, []int64{0, 90_000, 0, 0}))
		assert.Equal(t, 1, res.Ranks[0], "ranks 0, 2, 3 are at the expected count (1)")

		for _, bad := range []Config{
			{NewConvPlacement: PlacementLeastPrefill, LoadBalanceWeight: -1},
			{NewConvPlacement: PlacementLeastPrefill, LoadBalanceWeight: math.NaN()},
			{NewConvPlacement: PlacementLeastPrefill, LoadBalanceWeight: math.Inf(1)},
			{NewConvPlacement: PlacementLeastQueued, LoadBalanceWeight: 1},
			{LoadBalanceWeight: 0.5},
		} {
			bad.MaxActivePerRank = 10
			_, err := NewConversation(bad)
			require.ErrorContains(t, err, "load_balance_weight", "%+v", bad)
		}
	})
	t.Run("CR-16", func(t *testing.T) {
		r, err := New(NameConversation, Config{MaxActivePerRank: 10, NewConvPlacement: "least_queued"})
		require.NoError(t, err)
		assert.True(t, r.(*Conversation).leastQueued)
		assert.Empty(t, r.Notes())
		c, err := NewConversation(Config{MaxActivePerRank: 10, NewConvPlacement: "banana"})
		require.NoError(t, err)
		assert.False(t, c.leastQueued, "round-robin")
		require.Len(t, c.Notes(), 1, "one warning")
		assert.Contains(t, c.Notes()[0], "banana")
	})
	t.Run("CR-17", func(t *testing.T) {
		r, err := New(NameFor(false), Config{MaxActivePerRank: 10})
		require.NoError(t, err)
		_, ok := r.(*Default)
		assert.True(t, ok)
		assert.Equal(t, NameDefault, r.Name())
	})
	t.Run("CR-18", func(t *testing.T) {
		c := newConv(t, Config{MaxActivePerRank: 256})
		items := make([]Item, 40)
		for i := range items {
			items[i] = item(uint64(i), 10, conv("A"))
		}
		res := c.Route(items, mkStates(make([]int, 8), nil))
		home := homeOf(t, c, "A")
		for i, r := range res.Ranks {
			assert.Equal(t, home, r, "request %d", i)
		}
		assert.Equal(t, 40, res.Expected)
		for _, n := range countsOf(res, 8) {
			assert.LessOrEqual(t, n, res.Expected)
		}
	})
	t.Run("CR-19", func(t *testing.T) {
		c := newConv(t, Config{MaxActivePerRank: 64})
		active := []int{40, 40, 40, 64}
		res := c.Route(nItems(8, 10), mkStates(active, nil))
		assert.Len(t, res.Order, 8)
		assert.Equal(t, 64, res.Expected, "min(max(96, 64), 64)")
		for r, n := range countsOf(res, 4) {
			assert.LessOrEqual(t, active[r]+n, 64, "rank %d", r)
		}
	})
	t.Run("CR-20", func(t *testing.T) {
		c := newConv(t, Config{})
		items := []Item{{ID: 0, PromptLen: 10, HasTarget: true, Target: 1}, {ID: 1, PromptLen: 10, HasTarget: true, Target: 3}}
		res := c.Route(items, idle)
		assert.Equal(t, []int{1, 3}, res.Ranks, "unset relax = relaxed, explicit honoured")
	})
	t.Run("CR-21", func(t *testing.T) {
		c := newConv(t, Config{})
		res := c.Route([]Item{item(0, 10, conv("A1"), aff("P")), item(1, 10, conv("-")), item(2, 10, conv("A2"), aff("P"))}, idle)
		assert.Equal(t, res.Ranks[0], res.Ranks[2])
		assert.Equal(t, res.Ranks[0], homeOf(t, c, "P"))
		assert.False(t, c.bind.has("A1"))
	})
}

func TestNewErrors(t *testing.T) {
	_, err := New("banana", Config{MaxActivePerRank: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "default, conversation")
	_, err = New(NameDefault, Config{})
	assert.ErrorContains(t, err, "max_num_active_requests")
	_, err = NewConversation(Config{MaxActivePerRank: 1, MaxSessions: -1})
	assert.ErrorContains(t, err, "max_sessions")
	c, err := NewConversation(Config{MaxActivePerRank: 1, FairShareMultiplier: 0.5})
	require.NoError(t, err)
	assert.Equal(t, 1.0, c.multiplier, "m = max(1, multiplier)")
	c, err = NewConversation(Config{MaxActivePerRank: 1})
	require.NoError(t, err)
	assert.Equal(t, DefaultFairShareMultiplier, c.multiplier)
	assert.Equal(t, DefaultMaxSessions, c.bind.capacity)
	assert.Equal(t, DefaultMaxSessions, c.history.capacity)
}

// CE: uncached-prefill estimate (§6.7): conversation-aware router, demotion
// on with U = 32 768 and chunking on unless noted.
func TestUncachedEstimateCE(t *testing.T) {
	on := Config{Demotion: DemotionOn(32768, true)}
	one := mkStates([]int{0, 0}, nil)
	route := func(c *Conversation, items ...Item) Result { return ownedCopy(c.Route(items, one)) }

	t.Run("CE-01", func(t *testing.T) {
		c := newConv(t, Config{Demotion: DemotionOn(0, true)})
		res := route(c, item(0, 12000, conv("A")), item(1, 3000))
		assert.Nil(t, res.Estimates)
		assert.Equal(t, UnsetEstimate, res.Estimate(0))
		assert.Equal(t, 0, c.history.len())
	})
	t.Run("CE-02", func(t *testing.T) {
		c := newConv(t, Config{Demotion: DemotionOn(32768, false)})
		res := route(c, item(0, 12000, conv("A")))
		assert.Nil(t, res.Estimates)
		assert.Equal(t, 0, c.history.len())
	})
	t.Run("CE-03/CE-04/CE-08/CE-11", func(t *testing.T) {
		c := newConv(t, on)
		assert.Equal(t, []int64{12000}, route(c, item(0, 12000, conv("A"))).Estimates, "CE-03")
		h, _ := c.history.peek("A")
		assert.Equal(t, int64(12000), h)
		assert.Equal(t, []int64{500}, route(c, item(1, 12500, conv("A"))).Estimates, "CE-04")
		assert.Equal(t, []int64{4000}, route(c, item(2, 4000, conv("A"))).Estimates, "CE-08: shrunk → whole prompt")
		assert.Equal(t, []int64{0}, route(c, item(3, 4000, conv("A"))).Estimates, "CE-11: same length → 0")
	})
	t.Run("CE-05", func(t *testing.T) {
		c := newConv(t, on)
		route(c, item(0, 100, conv("B")))
		before := c.history.keys()
		res := route(c, item(1, 3000))
		assert.Equal(t, int64(3000), res.Estimate(0))
		assert.Equal(t, before, c.history.keys())
	})
	t.Run("CE-06", func(t *testing.T) {
		c := newConv(t, on)
		res := ownedCopy(c.Route([]Item{item(0, 10000, conv("A1"), aff("P")), item(1, 6000, conv("A2"), aff("P")),
			item(2, 10400, conv("A1"), aff("P"))}, mkStates([]int{0, 0, 0, 0}, nil)))
		assert.Equal(t, []int64{10000, 6000, 400}, res.Estimates)
		assert.Equal(t, []int{res.Ranks[0], res.Ranks[0], res.Ranks[0]}, res.Ranks, "all on one rank")
	})
	t.Run("CE-07", func(t *testing.T) {
		c := newConv(t, Config{Demotion: true, MaxSessions: 2})
		route(c, item(0, 1000, conv("c0")), item(1, 1000, conv("c1")), item(2, 1000, conv("c2")))
		assert.ElementsMatch(t, []string{"c1", "c2"}, c.history.keys())
		assert.Equal(t, int64(1500), route(c, item(3, 1500, conv("c0"))).Estimate(0), "evicted → first turn")
	})
	t.Run("CE-09", func(t *testing.T) {
		c := newConv(t, on)
		assert.Equal(t, []int64{1000, 300}, route(c, item(0, 1000, conv("A")), item(1, 1300, conv("A"))).Estimates)
	})
	t.Run("CE-10", func(t *testing.T) {
		a, b := newConv(t, on), newConv(t, on)
		for k := range 5 {
			items := []Item{item(uint64(3*k), 1000*(k+1), conv("A")), item(uint64(3*k+1), 500, conv(fmt.Sprint("B", k%2))),
				item(uint64(3*k+2), 700)}
			assert.Equal(t, route(a, items...), route(b, items...))
		}
		assert.Equal(t, a.history.keys(), b.history.keys())
		for _, k := range a.history.keys() {
			va, _ := a.history.peek(k)
			vb, _ := b.history.peek(k)
			assert.Equal(t, va, vb)
		}
	})
	t.Run("CE-12", func(t *testing.T) {
		c := newConv(t, Config{Demotion: true, MaxActivePerRank: 1})
		waiting := []Item{item(0, 5000, conv("X"), strict(0))}
		taken, waiting := PopWaiting(waiting, mkStates([]int{1, 0}, nil), 1)
		require.Empty(t, taken)
		require.Len(t, waiting, 1, "put back")
		res := c.Route(taken, mkStates([]int{1, 0}, nil))
		assert.Empty(t, res.Estimates, "no estimate in call 1")
		assert.Equal(t, 0, c.history.len())
		taken, waiting = PopWaiting(waiting, mkStates([]int{0, 0}, nil), 1)
		require.Len(t, taken, 1)
		assert.Empty(t, waiting)
		res = c.Route(taken, mkStates([]int{0, 0}, nil))
		assert.Equal(t, []int64{5000}, res.Estimates, "estimate computed in call 2")
		assert.Equal(t, 0, res.Ranks[0])
	})
	t.Run("CE-13", func(t *testing.T) {
		d, err := New(NameDefault, Config{MaxActivePerRank: 10, Demotion: true})
		require.NoError(t, err)
		res := d.Route([]Item{item(0, 12000, conv("A"))}, one)
		assert.Nil(t, res.Estimates)
		assert.Equal(t, UnsetEstimate, res.Estimate(0))
	})
}
