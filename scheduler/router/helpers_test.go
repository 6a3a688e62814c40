package router

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// mkStates builds rank states 0..len(active)-1; tokens may be nil (then
// 10 × active, the CR convention).
func mkStates(active []int, tokens []int64) []RankState {
	out := make([]RankState, len(active))
	for r, a := range active {
		t := int64(10 * a)
		if tokens != nil {
			t = tokens[r]
		}
		out[r] = RankState{Rank: r, ActiveRequests: a, ActiveTokens: t}
	}
	return out
}

// opt modifies a test item.
type opt func(*Item)

func strict(t int) opt { return func(it *Item) { it.HasTarget, it.Target, it.Strict = true, t, true } }
func relaxed(t int) opt {
	return func(it *Item) { it.HasTarget, it.Target, it.Strict = true, t, false }
}
func conv(c string) opt { return func(it *Item) { it.ConversationID = c } }
func aff(a string) opt  { return func(it *Item) { it.AffinityID = a } }

func item(id uint64, prompt int, opts ...opt) Item {
	it := Item{ID: id, PromptLen: prompt}
	for _, o := range opts {
		o(&it)
	}
	return it
}

// nItems returns n key-less, target-less items of the given prompt, ids 0..n-1.
func nItems(n, prompt int) []Item {
	out := make([]Item, n)
	for i := range out {
		out[i] = item(uint64(i), prompt)
	}
	return out
}

// perRank lists the item ids assigned to each rank, in placement order.
func perRank(items []Item, res Result, dp int) [][]uint64 {
	out := make([][]uint64, dp)
	for r := range out {
		out[r] = []uint64{}
		for _, i := range res.ForRank(r, nil) {
			out[r] = append(out[r], items[i].ID)
		}
	}
	return out
}

func ids(items []Item) []uint64 {
	out := []uint64{}
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}

func newDefault(t *testing.T, capH int) *Default {
	t.Helper()
	d, err := NewDefault(Config{MaxActivePerRank: capH})
	require.NoError(t, err)
	return d
}

func newConv(t *testing.T, cfg Config) *Conversation {
	t.Helper()
	if cfg.MaxActivePerRank == 0 {
		cfg.MaxActivePerRank = 1000
	}
	c, err := NewConversation(cfg)
	require.NoError(t, err)
	return c
}

// ownedCopy copies a result out of the router's buffers.
func ownedCopy(res Result) Result {
	out := Result{Expected: res.Expected}
	out.Ranks = append([]int{}, res.Ranks...)
	out.Order = append([]int{}, res.Order...)
	if res.Estimates != nil {
		out.Estimates = append([]int64{}, res.Estimates...)
	}
	return out
}
