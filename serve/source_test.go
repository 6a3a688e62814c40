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

// An idle loop waiting in WaitArrival wakes when a request comes, a handed
// request is withdrawn or the source closes; with one already waiting it
// does not wait at all; with nothing it waits the time it was given.
func TestSourceWakesAnIdleLoop(t *testing.T) {
	s := newSource()
	start := time.Now()
	s.WaitArrival(30 * time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "nothing came: the whole wait")

	wakes := []func(){
		func() { s.push(executor.Arrival{ID: 7}) },
		func() { s.cancel(7) }, // handed out (below), so announced: a wake
		func() { s.close() },
	}
	for i, wake := range wakes {
		done := make(chan struct{})
		go func() {
			s.WaitArrival(time.Hour)
			close(done)
		}()
		time.Sleep(20 * time.Millisecond) // the loop is waiting
		wake()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("wake %d did not wake the waiting loop", i)
		}
		if i == 0 {
			require.Len(t, s.Due(time.Now()), 1)
			require.Empty(t, s.Cancelled())
		} else if i == 1 {
			require.Equal(t, []uint64{7}, s.Cancelled())
		}
	}
	start = time.Now()
	s.WaitArrival(time.Hour) // closed: returns at once
	require.Less(t, time.Since(start), 10*time.Second)
}
