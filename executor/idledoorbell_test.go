package executor

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// doorbellComm records a rank's idle doorbells (nccl.IdleWaiter) as the
// number of collectives the rank had entered before each, with its
// arguments.
type doorbellComm struct {
	*nccl.LocalComm
	mu    sync.Mutex
	calls []string
	colls int
}

func (c *doorbellComm) AllGather(name string, data []byte) ([][]byte, error) {
	c.mu.Lock()
	c.colls++
	c.mu.Unlock()
	return c.LocalComm.AllGather(name, data)
}

func (c *doorbellComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	c.mu.Lock()
	c.colls++
	c.mu.Unlock()
	return c.LocalComm.Broadcast(name, root, data)
}

func (c *doorbellComm) AllReduceInt64(name string, op nccl.ReduceOp, vals []int64) ([]int64, error) {
	c.mu.Lock()
	c.colls++
	c.mu.Unlock()
	return c.LocalComm.AllReduceInt64(name, op, vals)
}

func (c *doorbellComm) IdleWait(root int, poll, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, fmt.Sprintf("after %d collectives: root %d poll %v timeout %v", c.colls, root, poll, timeout))
	return nil
}

// TestIdleDoorbellAgreed: with Config.IdlePoll set and a comm that is an
// nccl.IdleWaiter, every rank meets at the idle doorbell at the same points
// of its program (after the same collectives), from the third idle
// iteration in a row of each gap between arrivals, with rank 0 as root;
// the run's results are those of a run without it. With IdlePoll zero
// nobody calls it.
func TestIdleDoorbellAgreed(t *testing.T) {
	run := func(poll time.Duration) (*fleet, []*doorbellComm) {
		reqs := sampleRequests(t, 6, 0.05)
		for i := range reqs {
			reqs[i].Arrival = time.Duration(i) * 30 * time.Millisecond
		}
		comms := make([]*doorbellComm, 3)
		f := &fleet{ranks: 3, overlap: true, reqs: reqs, idlePoll: poll,
			wrapComm: func(rank int, c *nccl.LocalComm) nccl.Comm {
				comms[rank] = &doorbellComm{LocalComm: c}
				return comms[rank]
			}}
		f.mustRun(t)
		return f, comms
	}
	f, comms := run(250 * time.Microsecond)
	require.NotEmpty(t, comms[0].calls, "a run with idle gaps of 30 ms never met at the doorbell")
	require.Contains(t, comms[0].calls[0], "root 0 poll 250µs timeout 1.001s")
	for r := 1; r < len(comms); r++ {
		require.Equal(t, comms[0].calls, comms[r].calls, "rank %d met at the doorbell elsewhere than rank 0", r)
	}
	// Busy iterations and the first two idle ones of each gap have none.
	require.Less(t, int64(len(comms[0].calls)), f.results[0].Iterations-2)

	g, off := run(0)
	for r := range off {
		require.Empty(t, off[r].calls, "rank %d rang with IdlePoll 0", r)
	}
	require.Equal(t, g.digest(t), f.digest(t), "the doorbell changed what the fleet answered")
}

// TestIdleDoorbellFromThirdIdleIteration: the doorbell rings from the
// third idle iteration in a row (idleDoorbellAfter); a busy iteration
// starts the count again.
func TestIdleDoorbellFromThirdIdleIteration(t *testing.T) {
	rec := &doorbellComm{}
	e := &Executor{idleComm: rec, cfg: Config{IdlePoll: time.Millisecond, MaxIdleSleep: 20 * time.Millisecond}}
	var got []int
	for i := range 5 {
		require.NoError(t, e.idleDoorbell())
		got = append(got, len(rec.calls))
		if i == 3 {
			e.idleRun = 0 // as a busy iteration does
		}
	}
	require.Equal(t, []int{0, 0, 1, 2, 2}, got)
	require.Equal(t, "after 0 collectives: root 0 poll 1ms timeout 1.02s", rec.calls[0])
}
