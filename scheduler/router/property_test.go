package router

import (
	"container/heap"
	"fmt"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomQueue draws a waiting queue: some targets (strict or relaxed, a few
// out of range), some conversation and affinity ids from a small pool.
func randomQueue(rng *rand.Rand, n, dp int, nextID *uint64) []Item {
	out := make([]Item, n)
	for i := range out {
		it := Item{ID: *nextID, PromptLen: 1 + rng.IntN(4000)}
		*nextID++
		if rng.IntN(4) == 0 {
			it.HasTarget, it.Target, it.Strict = true, rng.IntN(dp+1), rng.IntN(2) == 0
		}
		if rng.IntN(3) > 0 {
			it.ConversationID = fmt.Sprint("c", rng.IntN(12))
		}
		if rng.IntN(5) == 0 {
			it.AffinityID = fmt.Sprint("p", rng.IntN(3))
		}
		out[i] = it
	}
	return out
}

// fleet simulates the ranks' loads across calls: routed requests stay
// active for a random number of calls.
type fleet struct {
	active []int
	tokens []int64
}

func (f *fleet) states() []RankState {
	out := make([]RankState, len(f.active))
	for r := range out {
		out[r] = RankState{Rank: r, ActiveRequests: f.active[r], ActiveTokens: f.tokens[r], PendingPrefill: f.tokens[r] / 2}
	}
	return out
}

// TestDeterminismProperty runs random workloads through two routers of each
// kind: one sees the gathered states in rank order, the other in a random
// order, and their maps are separate instances (so any decision taken from
// Go map iteration order would show). Every call must produce identical
// results, respect the cap (the pop runs first) and place every item once.
func TestDeterminismProperty(t *testing.T) {
	for _, name := range []string{NameDefault, NameConversation} {
		for _, placement := range Placements {
			for seed := range uint64(20) {
				t.Run(fmt.Sprint(name, "/", placement, "/", seed), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 7))
					dp, capH := 1+rng.IntN(8), 1+rng.IntN(12)
					cfg := Config{MaxActivePerRank: capH, MaxSessions: 1 + rng.IntN(10), NewConvPlacement: placement,
						FairShareMultiplier: 1 + rng.Float64()*2, Demotion: rng.IntN(2) == 0}
					if name == NameConversation && (placement == PlacementLeastTokens || placement == PlacementLeastPrefill) && rng.IntN(2) == 0 {
						cfg.LoadBalanceWeight = rng.Float64() * 3
					}
					a, err := New(name, cfg)
					require.NoError(t, err)
					b, err := New(name, cfg)
					require.NoError(t, err)
					f := fleet{active: make([]int, dp), tokens: make([]int64, dp)}
					var waiting []Item
					var nextID uint64
					for call := range 60 {
						waiting = append(waiting, randomQueue(rng, rng.IntN(2*dp+3), dp, &nextID)...)
						states := f.states()
						taken, rest := PopWaiting(waiting, states, capH)
						waiting = rest
						shuffled := slices.Clone(states)
						rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
						ra := ownedCopy(a.Route(taken, states))
						rb := ownedCopy(b.Route(taken, shuffled))
						require.Equal(t, ra, rb, "call %d", call)

						sorted := slices.Clone(ra.Order)
						slices.Sort(sorted)
						for i := range sorted {
							require.Equal(t, i, sorted[i], "Order is a permutation")
						}
						for i, r := range ra.Ranks {
							f.active[r]++
							f.tokens[r] += int64(taken[i].PromptLen)
						}
						for r := range dp {
							require.LessOrEqual(t, f.active[r], capH, "call %d rank %d over the cap", call, r)
							if name == NameConversation {
								require.LessOrEqual(t, f.active[r], ra.Expected, "expected covers every rank")
							}
						}
						// Retire some requests (prompt tokens removed at the mean).
						for r := range dp {
							if f.active[r] > 0 && rng.IntN(3) == 0 {
								k := 1 + rng.IntN(f.active[r])
								f.tokens[r] -= f.tokens[r] * int64(k) / int64(f.active[r])
								f.active[r] -= k
							}
						}
					}
				})
			}
		}
	}
}

// naiveDefault is the default router written literally from spec §2, with
// a real min-heap, as a reference model for the linear-scan implementation.
func naiveDefault(items []Item, states []RankState, capH int) []int {
	dp := len(states)
	count, tokens := make([]int, dp), make([]int64, dp)
	for _, s := range states {
		count[s.Rank], tokens[s.Rank] = s.ActiveRequests, s.ActiveTokens
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		sa, sb := items[a].Strict, items[b].Strict
		switch {
		case sa && !sb:
			return -1
		case sb && !sa:
			return 1
		}
		return 0
	})
	assign := make([]int, len(items))
	var rest []int
	for _, i := range idx {
		it := items[i]
		if it.HasTarget && it.Target >= 0 && it.Target < dp && count[it.Target] < capH {
			assign[i] = it.Target
			count[it.Target]++
			tokens[it.Target] += int64(it.PromptLen)
			continue
		}
		rest = append(rest, i)
	}
	sum, most := 0, 0
	for _, c := range count {
		sum += c
		most = max(most, c)
	}
	fair := (sum + len(rest) + dp - 1) / dp
	expected := min(max(fair, most), capH)
	slices.SortStableFunc(rest, func(a, b int) int { return items[b].PromptLen - items[a].PromptLen })
	h := &rankHeap{count: count, tokens: tokens}
	for r := range dp {
		if count[r] < expected {
			h.ranks = append(h.ranks, r)
		}
	}
	heap.Init(h)
	for _, i := range rest {
		r, fromHeap := -1, h.Len() > 0
		if fromHeap {
			r = heap.Pop(h).(int)
		} else {
			for q := range dp {
				if count[q] < capH && (r < 0 || count[q] < count[r]) {
					r = q
				}
			}
		}
		assign[i] = r
		count[r]++
		tokens[r] += int64(items[i].PromptLen)
		if fromHeap && count[r] < expected {
			heap.Push(h, r)
		}
	}
	return assign
}

type rankHeap struct {
	ranks  []int
	count  []int
	tokens []int64
}

func (h *rankHeap) Len() int { return len(h.ranks) }
func (h *rankHeap) Less(i, j int) bool {
	a, b := h.ranks[i], h.ranks[j]
	if h.tokens[a] != h.tokens[b] {
		return h.tokens[a] < h.tokens[b]
	}
	if h.count[a] != h.count[b] {
		return h.count[a] < h.count[b]
	}
	return a < b
}
func (h *rankHeap) Swap(i, j int) { h.ranks[i], h.ranks[j] = h.ranks[j], h.ranks[i] }
func (h *rankHeap) Push(x any)    { h.ranks = append(h.ranks, x.(int)) }
func (h *rankHeap) Pop() any {
	x := h.ranks[len(h.ranks)-1]
	h.ranks = h.ranks[:len(h.ranks)-1]
	return x
}

// TestDefaultMatchesHeapModel compares the default router with the literal
// min-heap model over random popped workloads.
func TestDefaultMatchesHeapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var nextID uint64
	for trial := range 500 {
		dp, capH := 1+rng.IntN(8), 1+rng.IntN(10)
		active, tokens := make([]int, dp), make([]int64, dp)
		for r := range dp {
			active[r] = rng.IntN(capH + 1)
			tokens[r] = int64(active[r] * rng.IntN(1000))
		}
		states := mkStates(active, tokens)
		queue := randomQueue(rng, rng.IntN(3*dp+2), dp, &nextID)
		for i := range queue {
			queue[i].PromptLen = 1 + rng.IntN(5) // many ties
		}
		taken, _ := PopWaiting(queue, states, capH)
		got := newDefault(t, capH).Route(taken, states)
		want := naiveDefault(taken, states, capH)
		if len(want) == 0 {
			assert.Empty(t, got.Ranks, "trial %d", trial)
			continue
		}
		assert.Equal(t, want, got.Ranks, "trial %d", trial)
	}
}

// TestRouteAllocations: in steady state (known keys, same batch sizes) a
// call allocates nothing; routing runs every iteration on every rank.
func TestRouteAllocations(t *testing.T) {
	states := mkStates([]int{1, 2, 3, 0, 4, 1, 0, 2}, nil)
	items := nItems(16, 100)
	for i := range items {
		items[i].ConversationID = fmt.Sprint("c", i%5)
		if i%4 == 0 {
			items[i].HasTarget, items[i].Target, items[i].Strict = true, i%8, i%8 == 0
		}
	}
	d := newDefault(t, 64)
	c := newConv(t, Config{MaxActivePerRank: 64, Demotion: true})
	d.Route(items, states)
	c.Route(items, states)
	assert.Zero(t, testing.AllocsPerRun(50, func() { d.Route(items, states) }), "default")
	assert.Zero(t, testing.AllocsPerRun(50, func() { c.Route(items, states) }), "conversation")
}

// TestPurity enforces DESIGN.md §1 for scheduler/router: standard library
// (pure parts) and this module's scheduler packages only.
func TestPurity(t *testing.T) {
	allowed := map[string]bool{"fmt": true, "math": true, "slices": true, "strings": true,
		"github.com/lockstep-ai/lockstep/scheduler": true}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			assert.True(t, allowed[p], "%s imports %q: the router must stay pure", f, p)
		}
	}
}

func BenchmarkRoute(b *testing.B) {
	states := mkStates(make([]int, 16), nil)
	items := nItems(64, 1000)
	for i := range items {
		items[i].ConversationID = fmt.Sprint("c", i%40)
	}
	for _, name := range []string{NameDefault, NameConversation} {
		r, _ := New(name, Config{MaxActivePerRank: 256, Demotion: true})
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Route(items, states)
			}
		})
	}
}
