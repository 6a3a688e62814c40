package executor

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ring behaves like a plain slice under random pushes, drops,
// put-backs and removals, across wrap-arounds and growth.
func TestWaitQueueMatchesSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q waitQueue
	var ref []Arrival
	next := uint64(0)
	for step := 0; step < 5000; step++ {
		switch rng.IntN(4) {
		case 0:
			var items []Arrival
			for range rng.IntN(9) {
				next++
				items = append(items, Arrival{ID: next})
			}
			q.PushBack(items)
			ref = append(ref, items...)
		case 1:
			k := rng.IntN(len(ref) + 1)
			q.DropFront(k)
			ref = ref[k:]
		case 2:
			var items []Arrival
			for range rng.IntN(4) {
				next++
				items = append(items, Arrival{ID: next})
			}
			q.PushFront(items)
			ref = append(append([]Arrival(nil), items...), ref...)
		case 3:
			// Remove (cancellations of queued requests): a random subset.
			drop := map[uint64]bool{}
			for _, a := range ref {
				if rng.IntN(5) == 0 {
					drop[a.ID] = true
				}
			}
			got := q.Remove(func(a *Arrival) bool { return drop[a.ID] }, nil)
			var kept, gone []Arrival
			for _, a := range ref {
				if drop[a.ID] {
					gone = append(gone, a)
				} else {
					kept = append(kept, a)
				}
			}
			require.Equal(t, gone, got, "step %d: the removed arrivals, in queue order", step)
			ref = kept
		}
		require.Equal(t, len(ref), q.Len(), "step %d", step)
		for i := range ref {
			require.Equal(t, ref[i].ID, q.At(i).ID, "step %d index %d", step, i)
		}
	}
	// Dropped slots are cleared (no prompt kept alive by the ring).
	q.DropFront(q.Len())
	for i := range q.buf {
		require.Zero(t, q.buf[i].ID, "slot %d kept an arrival", i)
	}
}

// A queue that a burst grew gives its storage back once it has drained;
// a small one keeps its ring for the next arrivals.
func TestWaitQueueTrimAfterBurst(t *testing.T) {
	var q waitQueue
	small := make([]Arrival, 10)
	for i := range small {
		small[i].ID = uint64(i)
	}
	q.PushBack(small)
	q.DropFront(10)
	q.Trim()
	require.Equal(t, 16, len(q.buf), "a small ring is kept")

	burst := make([]Arrival, 5000)
	for i := range burst {
		burst[i].ID = uint64(100 + i)
	}
	q.PushBack(burst)
	q.DropFront(4000)
	q.Trim()
	require.Equal(t, 8192, len(q.buf), "a queue still holding arrivals keeps its ring")
	require.True(t, q.Has(4100))
	q.DropFront(1000)
	q.Trim()
	require.Nil(t, q.buf)
	require.Nil(t, q.ids)
	require.False(t, q.Has(4100))
	q.PushBack(small)
	require.Equal(t, 10, q.Len())
	require.True(t, q.Has(3))
	require.Equal(t, uint64(9), q.At(9).ID)
}
