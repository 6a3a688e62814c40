package router

import "slices"

// Default is the load-balancing router (spec §2): explicit targets first,
// then the longest prompts go to the ranks with the fewest active tokens,
// no rank taking more than the fair share. It keeps no state across calls
// except reusable buffers.
type Default struct {
	capH int

	// Reused per call; see Result for their lifetime.
	count  []int
	tokens []int64
	order  []int
	rest   []int
	ranks  []int
	placed []int
}

// NewDefault builds the default router; only cfg.MaxActivePerRank is read.
func NewDefault(cfg Config) (*Default, error) {
	if err := cfg.validateCap(); err != nil {
		return nil, err
	}
	return &Default{capH: cfg.MaxActivePerRank}, nil
}

// Name returns NameDefault.
func (d *Default) Name() string { return NameDefault }

// Notes returns nothing: the default router has no configuration to warn about.
func (d *Default) Notes() []string { return nil }

// Route implements Router (spec §2). It never publishes estimates, so with
// this router no request is demoted.
func (d *Default) Route(items []Item, states []RankState) Result {
	dp := len(states)
	d.count = grow(d.count, dp)
	d.tokens = grow(d.tokens, dp)
	rankVectors(states, d.count, d.tokens, false)
	d.ranks = grow(d.ranks, len(items))
	d.placed = d.placed[:0]
	d.order = strictFirst(items, d.order)

	// Explicit placement: a target with room takes the item, strict or not.
	d.rest = d.rest[:0]
	for _, i := range d.order {
		t := items[i].target(dp)
		if t >= 0 && d.count[t] < d.capH {
			d.place(i, t, items[i].PromptLen)
			continue
		}
		d.rest = append(d.rest, i)
	}
	expected := expectedPerRank(d.count, len(d.rest), 1, d.capH)
	d.balance(items, d.rest, expected)
	return Result{Ranks: d.ranks, Order: d.placed, Expected: expected}
}

func (d *Default) place(i, rank, promptLen int) {
	d.ranks[i] = rank
	d.placed = append(d.placed, i)
	d.count[rank]++
	d.tokens[rank] += int64(promptLen)
}

// balance assigns the items indexed by rest given count, tokens and
// expected. Longest prompts go first; the stable sort keeps queue order among
// equal lengths (rest is sorted in place). The rank choice is the min-heap
// of spec §2 step 5 keyed (tokens, count, rank) over the ranks with
// count < expected; since counts only grow, "the ranks still in the heap" is
// exactly that set, and a linear scan over dp ranks finds the same minimum
// without allocating. With no such rank the item goes to the
// lowest (count, rank) below the cap H, or, when routing is called without
// the pop's budget and every rank is full, the lowest (count, rank) overall.
func (d *Default) balance(items []Item, rest []int, expected int) {
	slices.SortStableFunc(rest, func(a, b int) int { return items[b].PromptLen - items[a].PromptLen })
	for _, i := range rest {
		best := -1
		for r := range d.count {
			if d.count[r] >= expected {
				continue
			}
			if best < 0 || d.tokens[r] < d.tokens[best] ||
				(d.tokens[r] == d.tokens[best] && d.count[r] < d.count[best]) {
				best = r
			}
		}
		if best < 0 {
			best = leastCount(d.count, d.capH)
		}
		if best < 0 {
			best = leastCount(d.count, int(^uint(0)>>1))
		}
		d.place(i, best, items[i].PromptLen)
	}
}
