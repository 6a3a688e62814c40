package executor

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/workload"
)

// The waiting queue keeps priority order (lower first), arrival order among
// equals; equal priorities are first come, first served.
func TestWaitQueuePriorityOrder(t *testing.T) {
	var q waitQueue
	ids := func() []uint64 {
		var out []uint64
		for i := range q.Len() {
			out = append(out, q.At(i).ID)
		}
		return out
	}
	q.PushBack([]Arrival{{ID: 1}, {ID: 2}, {ID: 3, Priority: 2}, {ID: 4, Priority: -1}, {ID: 5}, {ID: 6, Priority: 2}})
	require.Equal(t, []uint64{4, 1, 2, 5, 3, 6}, ids())
	q.DropFront(2)
	q.PushFront([]Arrival{{ID: 4, Priority: -1}, {ID: 1}})
	q.PushBack([]Arrival{{ID: 7, Priority: 1}, {ID: 8, Priority: -5}})
	require.Equal(t, []uint64{8, 4, 1, 2, 5, 7, 3, 6}, ids())
	for i := range uint64(40) { // past the ring's first size, wrapping
		q.PushBack([]Arrival{{ID: 100 + i, Priority: int32(i % 3)}})
	}
	require.Equal(t, 48, q.Len())
	for i := 1; i < q.Len(); i++ {
		require.LessOrEqual(t, q.At(i-1).Priority, q.At(i).Priority, "at %d: %v", i, ids())
	}
	require.True(t, q.Has(8) && q.Has(139))

	// Random batches against a stable sort of everything pushed (the
	// queue's fronts dropped and put back as the router does).
	rng := rand.New(rand.NewPCG(7, 7))
	for round := range 200 {
		var q waitQueue
		var all []Arrival
		id := uint64(0)
		for range 1 + rng.IntN(8) {
			var batch []Arrival
			for range rng.IntN(12) {
				batch = append(batch, Arrival{ID: id, Priority: int32(rng.IntN(4)) - 1})
				id++
			}
			q.PushBack(batch)
			all = append(all, batch...)
			slices.SortStableFunc(all, byPriority)
			if k := rng.IntN(q.Len() + 1); k > 0 && rng.IntN(2) == 0 {
				front := make([]Arrival, k)
				for x := range k {
					front[x] = *q.At(x)
				}
				q.DropFront(k)
				q.PushFront(front)
			}
		}
		require.Equal(t, len(all), q.Len(), "round %d", round)
		for x := range all {
			require.Equal(t, all[x].ID, q.At(x).ID, "round %d, at %d", round, x)
			require.True(t, q.Has(all[x].ID))
		}
	}
}

// Priority scheduling end to end: low-priority requests fill every rank's
// cap, more wait; urgent ones arriving later are admitted ahead of the
// waiting ones and finish before them, on 1 and 2 ranks, in both loops;
// without priorities they finish last.
func TestPriorityServesTheUrgentFirst(t *testing.T) {
	for _, c := range []struct {
		ranks   int
		overlap bool
		fcfs    bool // every priority 0: the urgent ones wait their turn
	}{{1, false, false}, {1, true, false}, {2, false, false}, {2, true, false}, {1, false, true}, {2, true, true}} {
		var script [][]Arrival
		var low, urgent []uint64
		var first []Arrival
		for i := range uint64(8) {
			a := arrival(i, 40, 12)
			if !c.fcfs {
				a.Priority = 5
			}
			first = append(first, a)
			low = append(low, i)
		}
		script = append(script, first, nil)
		var late []Arrival
		for i := uint64(8); i < 10; i++ {
			a := arrival(i, 40, 12)
			if !c.fcfs {
				a.Priority = -1
			}
			late = append(late, a)
			urgent = append(urgent, i)
		}
		script = append(script, late)
		reqs := make([]workload.Request, 10)
		f := &fleet{ranks: c.ranks, overlap: c.overlap, maxActive: 2, reqs: reqs, source: &scriptSource{byIter: script}}
		f.run(t)
		f.requireNoErrors(t)
		var order []uint64
		for _, r := range f.results[0].Responses {
			require.Empty(t, r.Error)
			order = append(order, r.ID)
		}
		require.Len(t, order, 10, "%+v", c)
		// Each rank admitted its first 2 low ones before the urgent came;
		// the urgent ones finish before every low one still waiting.
		lastUrgent := max(slices.Index(order, urgent[0]), slices.Index(order, urgent[1]))
		waitingDone := 0
		for _, id := range order[:lastUrgent] {
			if slices.Contains(low, id) {
				waitingDone++
			}
		}
		if c.fcfs {
			require.Equal(t, 8, waitingDone, "%+v: first come, first served: %v", c, order)
			continue
		}
		require.LessOrEqual(t, waitingDone, 2*c.ranks, "%+v: %d low-priority requests finished before the urgent ones: %v", c, waitingDone, order)
	}
}

// An urgent request arriving at a full pool takes pages from the least
// urgent running ones (recompute preemption of requests behind it in the
// active list), and finishes first; first come, first served, it waits.
func TestPriorityPreemptsTheLeastUrgent(t *testing.T) {
	priorityPreempted, fcfsPreempted := 0, 0
	for _, fcfs := range []bool{false, true} {
		var lows []Arrival
		for i := range uint64(3) {
			a := arrival(i, 8, 40)
			if !fcfs {
				a.Priority = 3
			}
			lows = append(lows, a)
		}
		urgent := arrival(3, 16, 4)
		script := [][]Arrival{lows}
		for range 26 {
			script = append(script, nil)
		}
		script = append(script, []Arrival{urgent})
		f := &fleet{ranks: 1, pages: 12, reqs: make([]workload.Request, 4), source: &scriptSource{byIter: script}}
		f.run(t)
		f.requireNoErrors(t)
		var order []uint64
		preempted := 0
		for _, r := range f.results[0].Responses {
			require.Empty(t, r.Error)
			order = append(order, r.ID)
			if r.ID != 3 {
				preempted += r.Recomputed + r.Suspended
			}
		}
		if fcfs {
			require.NotEqual(t, uint64(3), order[0], "first come, first served: the late request waits (%v)", order)
			fcfsPreempted = preempted
			continue
		}
		require.Equal(t, uint64(3), order[0], "the urgent request finishes first (%v)", order)
		priorityPreempted = preempted
	}
	require.Greater(t, priorityPreempted, fcfsPreempted, "the urgent request's pages come from preempting low ones")
}
