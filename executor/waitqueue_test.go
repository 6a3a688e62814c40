package executor

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ring behaves like a plain slice under random pushes, drops and
// put-backs, across wrap-arounds and growth.
func TestWaitQueueMatchesSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q waitQueue
	var ref []Arrival
	next := uint64(0)
	for step := 0; step < 5000; step++ {
		switch rng.IntN(3) {
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
