package nccl_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// memTransport is an in-memory Transport: one allgather of a local group
// under a fixed name, so it pairs by call order exactly like MPI or TCP.
type memTransport struct{ c *nccl.LocalComm }

func (m memTransport) Rank() int                                 { return m.c.Rank() }
func (m memTransport) Size() int                                 { return m.c.Size() }
func (m memTransport) AllGatherBytes(p []byte) ([][]byte, error) { return m.c.AllGather("wire", p) }
func (m memTransport) Close() error                              { return m.c.Close() }

// checkedGroup returns size checked comms over in-memory transports.
func checkedGroup(size int) []*nccl.CheckedComm {
	locals := nccl.NewLocalGroup(size, nccl.LocalOptions{Timeout: 5 * time.Second})
	out := make([]*nccl.CheckedComm, size)
	for r, l := range locals {
		out[r] = nccl.NewCheckedComm(memTransport{l})
	}
	return out
}

// runAll runs fn(rank) for every rank in its own goroutine and returns each
// rank's error; it fails the test instead of hanging.
func runAll(t *testing.T, size int, fn func(r int) error) []error {
	t.Helper()
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = fn(r) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("ranks hung")
	}
	return errs
}

// exerciseCollectives runs one of each collective on c and checks the
// results; it is shared by the checked, TCP and multi-process tests' logic.
func exerciseCollectives(c nccl.Comm) error {
	r, size := c.Rank(), c.Size()
	mine := slices.Repeat([]byte{byte(r)}, r+1) // variable sizes, rank 1 may send 0 bytes below
	if r == 1 {
		mine = nil
	}
	got, err := c.AllGather("gather", mine)
	if err != nil {
		return err
	}
	for p := range size {
		want := slices.Repeat([]byte{byte(p)}, p+1)
		if p == 1 {
			want = nil
		}
		if !slices.Equal(got[p], want) {
			return fmt.Errorf("allgather[%d] = %v, want %v", p, got[p], want)
		}
	}
	for root := range size {
		b, err := c.Broadcast("bcast", root, []byte(fmt.Sprint("from ", r)))
		if err != nil {
			return err
		}
		if want := fmt.Sprint("from ", root); string(b) != want {
			return fmt.Errorf("broadcast root %d = %q, want %q", root, b, want)
		}
	}
	vals := []int64{int64(r), -int64(r), 1 << 40}
	for _, tc := range []struct {
		op   nccl.ReduceOp
		want []int64
	}{
		{nccl.ReduceSum, []int64{int64(size * (size - 1) / 2), -int64(size * (size - 1) / 2), int64(size) << 40}},
		{nccl.ReduceMin, []int64{0, -int64(size - 1), 1 << 40}},
		{nccl.ReduceMax, []int64{int64(size - 1), 0, 1 << 40}},
	} {
		out, err := c.AllReduceInt64("reduce", tc.op, vals)
		if err != nil {
			return err
		}
		if !slices.Equal(out, tc.want) {
			return fmt.Errorf("allreduce %s = %v, want %v", tc.op, out, tc.want)
		}
	}
	empty, err := c.AllReduceInt64("empty", nccl.ReduceMax, nil)
	if err != nil || len(empty) != 0 {
		return fmt.Errorf("empty allreduce = %v, %v", empty, err)
	}
	return nil
}

func TestCheckedCollectives(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("size", size), func(t *testing.T) {
			comms := checkedGroup(size)
			errs := runAll(t, size, func(r int) error { return exerciseCollectives(comms[r]) })
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			for r := 1; r < size; r++ {
				require.Equal(t, comms[0].Trace(), comms[r].Trace(), "trace of rank %d", r)
			}
			require.Len(t, comms[0].Trace(), 1+size+3+1)
			require.Equal(t, "allgather:gather", comms[0].Trace()[0].String())
			for _, c := range comms {
				require.NoError(t, c.Close())
			}
		})
	}
}

// TestCheckedMismatch perturbs one rank's collective and expects every rank
// to fail with the same message naming both sides.
func TestCheckedMismatch(t *testing.T) {
	type call func(c nccl.Comm) error
	gather := func(name string) call {
		return func(c nccl.Comm) error { _, err := c.AllGather(name, []byte("x")); return err }
	}
	bcast := func(name string, root int) call {
		return func(c nccl.Comm) error { _, err := c.Broadcast(name, root, []byte("x")); return err }
	}
	reduce := func(name string, op nccl.ReduceOp, n int) call {
		return func(c nccl.Comm) error { _, err := c.AllReduceInt64(name, op, make([]int64, n)); return err }
	}
	for _, tc := range []struct {
		name      string
		normal    call // what every rank but the odd one calls
		odd       call // rank oddRank's call
		oddRank   int
		want      string
		sentinel  error
		checkNext bool // the group stays paired: a matching call afterwards works
	}{
		{"kind", gather("batch_size"), bcast("arrivals", 0), 1,
			`collective #0 mismatch: rank 0 entered allgather:"batch_size", rank 1 entered broadcast:"arrivals"`, nccl.ErrMismatch, true},
		{"name", gather("a"), gather("b"), 3,
			`collective #0 mismatch: rank 0 entered allgather:"a", rank 3 entered allgather:"b"`, nccl.ErrMismatch, true},
		{"rank 0 odd", gather("a"), gather("b"), 0,
			`collective #0 mismatch: rank 0 entered allgather:"b", rank 1 entered allgather:"a"`, nccl.ErrMismatch, true},
		{"root", bcast("b", 0), bcast("b", 1), 2,
			`collective #0 mismatch: rank 0 entered broadcast:"b"(root 0), rank 2 entered broadcast:"b"(root 1)`, nccl.ErrMismatch, true},
		{"op", reduce("r", nccl.ReduceMax, 2), reduce("r", nccl.ReduceMin, 2), 1,
			`collective #0 mismatch: rank 0 entered allreduce:"r"(max, len 2), rank 1 entered allreduce:"r"(min, len 2)`, nccl.ErrMismatch, true},
		{"length", reduce("r", nccl.ReduceSum, 2), reduce("r", nccl.ReduceSum, 3), 3,
			`collective #0 mismatch: rank 0 entered allreduce:"r"(sum, len 2), rank 3 entered allreduce:"r"(sum, len 3)`, nccl.ErrMismatch, true},
		{"root out of range on every rank", bcast("b", 7), bcast("b", 7), 1,
			`collective #0 broadcast:"b": root 7 outside the group [0, 4)`, nil, true},
		{"unknown op on every rank", reduce("r", nccl.ReduceOp(9), 1), reduce("r", nccl.ReduceOp(9), 1), 1,
			`collective #0 allreduce:"r": unknown reduce op(9)`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 4
			comms := checkedGroup(size)
			errs := runAll(t, size, func(r int) error {
				fn := tc.normal
				if r == tc.oddRank {
					fn = tc.odd
				}
				err := fn(comms[r])
				if err == nil {
					return errors.New("no error")
				}
				if tc.checkNext {
					if _, err2 := comms[r].AllGather("next", nil); err2 != nil {
						return fmt.Errorf("next call after the failure: %w", err2)
					}
				}
				return err
			})
			for r, err := range errs {
				require.EqualError(t, err, tc.want, "rank %d", r)
				if tc.sentinel != nil {
					require.ErrorIs(t, err, tc.sentinel, "rank %d", r)
				}
			}
			for r := 1; r < size; r++ {
				if r != tc.oddRank && tc.oddRank != 0 {
					require.Equal(t, comms[0].Trace(), comms[r].Trace())
				}
			}
		})
	}
}

// TestCheckedOrder: rank 1 enters the same two collectives in the other
// order; the first call is reported, and the second too.
func TestCheckedOrder(t *testing.T) {
	comms := checkedGroup(2)
	errs := runAll(t, 2, func(r int) error {
		names := []string{"rank_state", "batch_size"}
		if r == 1 {
			slices.Reverse(names)
		}
		var msgs []string
		for _, n := range names {
			_, err := comms[r].AllGather(n, nil)
			if !errors.Is(err, nccl.ErrMismatch) {
				return fmt.Errorf("call %q: %v, want a mismatch", n, err)
			}
			msgs = append(msgs, err.Error())
		}
		return errors.New(strings.Join(msgs, "; "))
	})
	want := `collective #0 mismatch: rank 0 entered allgather:"rank_state", rank 1 entered allgather:"batch_size"; ` +
		`collective #1 mismatch: rank 0 entered allgather:"batch_size", rank 1 entered allgather:"rank_state"`
	require.EqualError(t, errs[0], want)
	require.EqualError(t, errs[1], want)
}

// TestCheckedForeignPayload: a member that sends something other than a
// checked header (a different program on the same transport) is named.
func TestCheckedForeignPayload(t *testing.T) {
	locals := nccl.NewLocalGroup(2, nccl.LocalOptions{Timeout: 5 * time.Second})
	c0 := nccl.NewCheckedComm(memTransport{locals[0]})
	errs := runAll(t, 2, func(r int) error {
		if r == 1 {
			_, err := locals[1].AllGather("wire", []byte("hello"))
			return err
		}
		_, err := c0.AllGather("a", nil)
		return err
	})
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[0], nccl.ErrMismatch)
	require.Contains(t, errs[0].Error(), "rank 1 sent a payload that is not a collective header")
}

// TestCheckedTransportFailure: a failed transport poisons the comm, and the
// failed call is still in the trace.
func TestCheckedTransportFailure(t *testing.T) {
	comms := checkedGroup(2)
	require.NoError(t, comms[1].Close())
	_, err := comms[0].AllGather("a", nil)
	require.ErrorIs(t, err, nccl.ErrClosed)
	require.Contains(t, err.Error(), `collective #0 allgather:"a" on rank 0`)
	_, err = comms[0].Broadcast("b", 0, nil)
	require.ErrorIs(t, err, nccl.ErrClosed)
	require.Len(t, comms[0].Trace(), 1, "the call refused before the transport is not traced")
	_, err = comms[1].AllGather("a", nil)
	require.ErrorIs(t, err, nccl.ErrClosed)
	require.NoError(t, comms[1].Close(), "Close is idempotent")
	require.NoError(t, comms[0].Close())
}

// bellTransport is a memTransport that is an IdleWaiter: it records the
// doorbells it is asked for.
type bellTransport struct {
	memTransport
	calls *[]string
}

func (b bellTransport) IdleWait(root int, poll, timeout time.Duration) error {
	*b.calls = append(*b.calls, fmt.Sprintf("root %d poll %v timeout %v", root, poll, timeout))
	return nil
}

// TestIdleWaitForwarded: a CheckedComm (and a Watchdog over it) passes the
// idle doorbell to a transport that has one, and to nothing else; it
// numbers and traces nothing; after Close it fails without reaching the
// transport.
func TestIdleWaitForwarded(t *testing.T) {
	locals := nccl.NewLocalGroup(1, nccl.LocalOptions{})
	var calls []string
	c := nccl.NewCheckedComm(bellTransport{memTransport{locals[0]}, &calls})
	w := nccl.NewWatchdog(c, nccl.WatchdogOptions{Timeout: time.Second})
	require.NoError(t, w.IdleWait(0, time.Millisecond, time.Second))
	require.NoError(t, c.IdleWait(0, 2*time.Millisecond, 3*time.Second))
	require.Equal(t, []string{"root 0 poll 1ms timeout 1s", "root 0 poll 2ms timeout 3s"}, calls)
	require.Empty(t, c.Trace(), "the doorbell is not a collective")

	plain := nccl.NewCheckedComm(memTransport{nccl.NewLocalGroup(1, nccl.LocalOptions{})[0]})
	require.NoError(t, plain.IdleWait(0, time.Millisecond, time.Second), "a transport without a doorbell")

	require.NoError(t, c.Close())
	require.ErrorIs(t, c.IdleWait(0, time.Millisecond, time.Second), nccl.ErrClosed)
	require.Len(t, calls, 2)
}
