package serve

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
)

// A withdrawal reaches the ranks only for ids they know: queued ids are
// dropped, ids handed out by the current intake wait one intake, finished
// ids are gone.
func TestSourceCancellationTiming(t *testing.T) {
	s := newSource()
	now := time.Now()
	require.True(t, s.push(executor.Arrival{ID: 1}))
	require.True(t, s.push(executor.Arrival{ID: 2}))
	require.True(t, s.cancel(1), "a queued id is dropped")
	got := s.Due(now)
	require.Len(t, got, 1)
	require.Equal(t, uint64(2), got[0].ID)
	require.False(t, s.cancel(2), "handed out by this intake: announced later")
	require.Empty(t, s.Cancelled(), "not in the intake that handed it out")
	require.Equal(t, []uint64{2}, s.Cancelled())
	s.finished(2)
	require.True(t, s.cancel(2), "finished: nothing to withdraw")
	require.True(t, s.cancel(99))
	require.False(t, s.Exhausted())
	s.close()
	require.True(t, s.Exhausted())
	require.False(t, s.push(executor.Arrival{ID: 3}))
}
