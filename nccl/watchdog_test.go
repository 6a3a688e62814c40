package nccl_test

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// openTorchrunGroup opens a torchrun-style world of size goroutine ranks on
// loopback through OpenProcessGroup.
func openTorchrunGroup(t *testing.T, size int, timeout time.Duration) []*nccl.ProcessGroup {
	t.Helper()
	port := freePort(t)
	groups := make([]*nccl.ProcessGroup, size)
	errs := runAll(t, size, func(r int) error {
		env := map[string]string{"RANK": fmt.Sprint(r), "WORLD_SIZE": fmt.Sprint(size),
			"LOCAL_RANK": fmt.Sprint(r), "LOCAL_WORLD_SIZE": fmt.Sprint(size),
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": fmt.Sprint(port)}
		l, err := nccl.DetectLaunch(func(k string) string { return env[k] })
		if err != nil {
			return err
		}
		groups[r], err = nccl.OpenProcessGroup(l, nccl.GroupOptions{CollectiveTimeout: timeout, ConnectTimeout: 5 * time.Second})
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return groups
}

func TestProcessGroupTorchrun(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("size", size), func(t *testing.T) {
			noLeaks(t)
			groups := openTorchrunGroup(t, size, 5*time.Second)
			errs := runAll(t, size, func(r int) error {
				groups[r].Comm.SetIteration(7)
				return exerciseCollectives(groups[r].Comm)
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			for r := range size {
				require.Equal(t, groups[0].Comm.Trace(), groups[r].Comm.Trace())
			}
			// Rank 0 closes last: it serves the store.
			for r := size - 1; r >= 0; r-- {
				require.NoError(t, groups[r].Close())
			}
		})
	}
}

// TestWatchdogRankStops: rank 2 stops after two collectives; every other
// rank fails within the timeout with a report naming the collective, the
// iteration and what every peer last entered.
func TestWatchdogRankStops(t *testing.T) {
	noLeaks(t)
	const size = 4
	timeout := 500 * time.Millisecond
	groups := openTorchrunGroup(t, size, timeout)
	release := make(chan struct{})
	elapsed := make([]time.Duration, size)
	errs := runAll(t, size, func(r int) error {
		c := groups[r].Comm
		c.SetIteration(41)
		if _, err := c.AllGather("rank_state", nil); err != nil {
			return err
		}
		c.SetIteration(42)
		if _, err := c.Broadcast("arrivals", 0, nil); err != nil {
			return err
		}
		if r == 2 {
			<-release // stops here, having left broadcast #1
			return nil
		}
		start := time.Now()
		_, err := c.AllReduceInt64("batch_size", nccl.ReduceMax, []int64{1})
		elapsed[r] = time.Since(start)
		if r == 3 {
			close(release) // the last rank to fail lets rank 2 go
		}
		return err
	})
	// Rank 3 may close release before the others time out; the report of
	// every failing rank is checked regardless.
	for r, err := range errs {
		if r == 2 {
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, nccl.ErrTimeout, "rank %d", r)
		msg := err.Error()
		require.Contains(t, msg, fmt.Sprintf(`collective #2 allreduce:"batch_size" at iteration 42 timed out after 500ms on rank %d`, r))
		require.Contains(t, msg, fmt.Sprintf("rank %d (this rank) is in it", r))
		require.Contains(t, msg, `rank 2 last entered broadcast:"arrivals" (#1, iteration 42) and returned from it`)
		for p := range size {
			if p != r && p != 2 {
				require.Contains(t, msg, fmt.Sprintf(`rank %d last entered allreduce:"batch_size" (#2, iteration 42) and is still in it`, p))
			}
		}
		require.Less(t, elapsed[r], timeout+2*time.Second, "rank %d", r)
		require.GreaterOrEqual(t, elapsed[r], timeout)
		// The watchdog is poisoned: later calls fail at once with the same error.
		_, err2 := groups[r].Comm.AllGather("after", nil)
		require.Equal(t, err, err2)
	}
	for r := size - 1; r >= 0; r-- {
		groups[r].Close() // unblocks the helpers stuck in the TCP transport
	}
}

// stuckComm is a Comm whose collectives block until released.
type stuckComm struct {
	nccl.Comm
	release chan struct{}
}

func (s stuckComm) AllGather(string, []byte) ([][]byte, error) {
	<-s.release
	return nil, errors.New("released")
}

// TestWatchdogWithoutBoard: without a board the report says so; a call that
// returns in time passes through, including its error.
func TestWatchdogWithoutBoard(t *testing.T) {
	noLeaks(t)
	local := nccl.NewLocalGroup(1, nccl.LocalOptions{})
	w := nccl.NewWatchdog(local[0], nccl.WatchdogOptions{Timeout: time.Second})
	got, err := w.AllGather("fine", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("x")}, got)
	require.Len(t, w.Trace(), 1)

	s := stuckComm{Comm: local[0], release: make(chan struct{})}
	w = nccl.NewWatchdog(s, nccl.WatchdogOptions{Timeout: 50 * time.Millisecond})
	w.SetIteration(3)
	_, err = w.AllGather("events", nil)
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Regexp(t, regexp.MustCompile(`^collective #0 allgather:"events" at iteration 3 timed out after 50ms on rank 0: no peer board`), err.Error())
	close(s.release) // the helper goroutine returns; noLeaks checks it
	require.Nil(t, w.Trace())

	w = nccl.NewWatchdog(local[0], nccl.WatchdogOptions{}) // no timeout
	_, err = w.Broadcast("b", 1, nil)
	require.ErrorContains(t, err, "root 1 outside the group")
}
