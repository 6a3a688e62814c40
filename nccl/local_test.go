package nccl_test

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/nccl"
)

// runRanks runs fn on every member in its own goroutine and returns each
// rank's error. It fails the test instead of hanging if a rank never returns.
func runRanks(t *testing.T, comms []*nccl.LocalComm, fn func(c *nccl.LocalComm) error) []error {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() { errs[i] = fn(c) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ranks hung")
	}
	return errs
}

// noErrors fails on any rank error.
func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// checkNoLeak fails if goroutines outlive the test body (the group must not
// start any).
func checkNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		for range 50 {
			if runtime.NumGoroutine() <= before {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("goroutines: %d before, %d after", before, runtime.NumGoroutine())
	})
}

func TestCollectives(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("size", size), func(t *testing.T) {
			checkNoLeak(t)
			comms := nccl.NewLocalGroup(size, nccl.LocalOptions{})
			errs := runRanks(t, comms, func(c *nccl.LocalComm) error {
				r := c.Rank()
				if c.Size() != size {
					return fmt.Errorf("size %d", c.Size())
				}
				// Variable sizes: rank r sends r+1 bytes of value r.
				mine := slices.Repeat([]byte{byte(r)}, r+1)
				got, err := c.AllGather("gather", mine)
				if err != nil {
					return err
				}
				mine[0] = 99 // the group holds its own copy
				for p := range size {
					if want := slices.Repeat([]byte{byte(p)}, p+1); !slices.Equal(got[p], want) {
						return fmt.Errorf("allgather[%d] = %v, want %v", p, got[p], want)
					}
				}
				root := size - 1
				b, err := c.Broadcast("bcast", root, []byte(fmt.Sprint("from ", r)))
				if err != nil {
					return err
				}
				if want := fmt.Sprint("from ", root); string(b) != want {
					return fmt.Errorf("broadcast = %q, want %q", b, want)
				}
				vals := []int64{int64(r), int64(-r), 7}
				for _, tc := range []struct {
					op   nccl.ReduceOp
					want []int64
				}{
					{nccl.ReduceSum, []int64{int64(size * (size - 1) / 2), -int64(size * (size - 1) / 2), int64(7 * size)}},
					{nccl.ReduceMin, []int64{0, -int64(size - 1), 7}},
					{nccl.ReduceMax, []int64{int64(size - 1), 0, 7}},
				} {
					got, err := c.AllReduceInt64("reduce_"+tc.op.String(), tc.op, vals)
					if err != nil {
						return err
					}
					if !slices.Equal(got, tc.want) {
						return fmt.Errorf("allreduce %s = %v, want %v", tc.op, got, tc.want)
					}
				}
				return nil
			})
			noErrors(t, errs)
			for _, c := range comms {
				c.Close()
			}
		})
	}
}

// TestGatherOwnership: results are copies; mutating one rank's result does
// not change another's.
func TestGatherOwnership(t *testing.T) {
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
	results := make([][][]byte, 2)
	noErrors(t, runRanks(t, comms, func(c *nccl.LocalComm) error {
		var err error
		results[c.Rank()], err = c.AllGather("x", []byte{byte(c.Rank()), 1})
		return err
	}))
	results[0][1][0] = 42
	if results[1][1][0] != 1 {
		t.Fatal("ranks share result buffers")
	}
}

func TestMismatch(t *testing.T) {
	type call func(c *nccl.LocalComm) error
	gather := func(name string) call {
		return func(c *nccl.LocalComm) error { _, err := c.AllGather(name, nil); return err }
	}
	bcast := func(name string, root int) call {
		return func(c *nccl.LocalComm) error { _, err := c.Broadcast(name, root, []byte{1}); return err }
	}
	reduce := func(name string, op nccl.ReduceOp, n int) call {
		return func(c *nccl.LocalComm) error { _, err := c.AllReduceInt64(name, op, make([]int64, n)); return err }
	}
	tests := []struct {
		name  string
		calls [][]call // per rank, in order; the last call of each rank mismatches
		want  string
	}{
		{"kind", [][]call{{gather("a"), gather("batch_size")}, {gather("a"), bcast("new_items", 0)}, {gather("a"), gather("batch_size")}},
			`collective #1 mismatch: rank 0 entered allgather:"batch_size", rank 1 entered broadcast:"new_items"`},
		{"name", [][]call{{gather("rank_state")}, {gather("rank_state")}, {gather("batch_size")}},
			`collective #0 mismatch: rank 0 entered allgather:"rank_state", rank 2 entered allgather:"batch_size"`},
		{"order", [][]call{{gather("x"), bcast("y", 0)}, {bcast("y", 0), gather("x")}},
			`collective #0 mismatch: rank 0 entered allgather:"x", rank 1 entered broadcast:"y"`},
		{"op", [][]call{{reduce("q", nccl.ReduceSum, 2)}, {reduce("q", nccl.ReduceMax, 2)}},
			`rank 0 entered allreduce:"q"(sum, len 2), rank 1 entered allreduce:"q"(max, len 2)`},
		{"length", [][]call{{reduce("q", nccl.ReduceSum, 2)}, {reduce("q", nccl.ReduceSum, 3)}},
			`rank 0 entered allreduce:"q"(sum, len 2), rank 1 entered allreduce:"q"(sum, len 3)`},
		{"root", [][]call{{bcast("b", 0)}, {bcast("b", 1)}},
			`rank 0 entered broadcast:"b"(root 0), rank 1 entered broadcast:"b"(root 1)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkNoLeak(t)
			comms := nccl.NewLocalGroup(len(tt.calls), nccl.LocalOptions{Timeout: 5 * time.Second})
			errs := runRanks(t, comms, func(c *nccl.LocalComm) error {
				for _, f := range tt.calls[c.Rank()] {
					if err := f(c); err != nil {
						return err // the first failure ends the rank, as it would the process
					}
				}
				return nil
			})
			for r, err := range errs {
				if !errors.Is(err, nccl.ErrMismatch) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("rank %d: error %v, want ErrMismatch containing %q", r, err, tt.want)
				}
			}
		})
	}
}

func TestBadRootAndOp(t *testing.T) {
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
	errs := runRanks(t, comms, func(c *nccl.LocalComm) error {
		_, err := c.Broadcast("b", 5, nil)
		if err == nil || !strings.Contains(err.Error(), "root 5") {
			return fmt.Errorf("broadcast with root 5: %v", err)
		}
		_, err = c.AllReduceInt64("r", nccl.ReduceOp(9), []int64{1})
		if err == nil || !strings.Contains(err.Error(), "unknown reduce") {
			return fmt.Errorf("allreduce with op 9: %v", err)
		}
		_, err = c.AllGather("after", []byte{1}) // the group still works
		return err
	})
	noErrors(t, errs)
}

func TestWatchdog(t *testing.T) {
	checkNoLeak(t)
	comms := nccl.NewLocalGroup(3, nccl.LocalOptions{Timeout: 50 * time.Millisecond})
	errs := runRanks(t, comms, func(c *nccl.LocalComm) error {
		if _, err := c.Broadcast("new_items", 0, []byte{1}); err != nil {
			return err
		}
		if c.Rank() == 2 {
			return nil // rank 2 never reaches the next collective
		}
		_, err := c.AllGather("batch_size", []byte{1})
		return err
	})
	if errs[2] != nil {
		t.Fatalf("rank 2: %v", errs[2])
	}
	for r := range 2 {
		msg := fmt.Sprint(errs[r])
		if !errors.Is(errs[r], nccl.ErrTimeout) {
			t.Fatalf("rank %d: %v, want ErrTimeout", r, errs[r])
		}
		for _, want := range []string{`collective #1 allgather:"batch_size" timed out after 50ms`,
			`rank 0 entered allgather:"batch_size" (#1)`, `rank 1 entered allgather:"batch_size" (#1)`,
			`rank 2 last entered broadcast:"new_items" (#0)`} {
			if !strings.Contains(msg, want) {
				t.Errorf("rank %d: %q lacks %q", r, msg, want)
			}
		}
	}
}

func TestWatchdogNothingYet(t *testing.T) {
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{Timeout: 20 * time.Millisecond})
	_, err := comms[0].AllReduceInt64("init_status", nccl.ReduceMax, []int64{0})
	if !errors.Is(err, nccl.ErrTimeout) || !strings.Contains(err.Error(), "rank 1 entered nothing yet") {
		t.Fatalf("error %v", err)
	}
	// The late rank sees the failed call instead of hanging.
	if _, err := comms[1].AllReduceInt64("init_status", nccl.ReduceMax, []int64{0}); !errors.Is(err, nccl.ErrTimeout) {
		t.Fatalf("late rank: %v", err)
	}
}

func TestCloseWakesPeers(t *testing.T) {
	checkNoLeak(t)
	comms := nccl.NewLocalGroup(3, nccl.LocalOptions{})
	entered := make(chan struct{}, 2)
	errs := runRanks(t, comms, func(c *nccl.LocalComm) error {
		if c.Rank() == 2 {
			<-entered
			<-entered
			time.Sleep(10 * time.Millisecond) // let both peers block
			return c.Close()
		}
		entered <- struct{}{}
		_, err := c.AllGather("rank_state", nil)
		return err
	})
	for r := range 2 {
		if !errors.Is(errs[r], nccl.ErrClosed) || !strings.Contains(errs[r].Error(), "rank 2 closed") {
			t.Errorf("rank %d: %v, want ErrClosed naming rank 2", r, errs[r])
		}
	}
	// Later calls: on the closed member, and on peers that need it.
	if _, err := comms[2].AllGather("x", nil); !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("closed member: %v", err)
	}
	if _, err := comms[0].Broadcast("x", 0, nil); !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("peer of a closed member: %v", err)
	}
	if err := comms[2].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTracesMatch(t *testing.T) {
	comms := nccl.NewLocalGroup(4, nccl.LocalOptions{})
	program := func(c *nccl.LocalComm) error {
		for iter := range 5 {
			if _, err := c.AllGather("rank_state", []byte{byte(c.Rank())}); err != nil {
				return err
			}
			if _, err := c.Broadcast("new_items", 0, []byte{byte(iter)}); err != nil {
				return err
			}
			if _, err := c.AllReduceInt64("can_queue", nccl.ReduceMin, []int64{1}); err != nil {
				return err
			}
		}
		return nil
	}
	noErrors(t, runRanks(t, comms, program))
	want := comms[0].Trace()
	if len(want) != 15 || want[14] != (nccl.TraceEntry{Seq: 14, Kind: nccl.KindAllReduce, Name: "can_queue"}) {
		t.Fatalf("trace of rank 0: %v", want)
	}
	for _, c := range comms[1:] {
		if got := c.Trace(); !slices.Equal(got, want) {
			t.Errorf("rank %d trace differs:\n%v\n%v", c.Rank(), got, want)
		}
	}
	for _, c := range comms {
		c.ResetTrace()
	}
	noErrors(t, runRanks(t, comms, program))
	if got := comms[3].Trace(); len(got) != 15 || got[0].Seq != 15 {
		t.Errorf("after reset: %v (call numbers keep counting)", got)
	}
}

// A member's trace keeps the last MaxTraceEntries collectives: a fleet
// that iterates for days no longer holds one entry per collective it ever
// ran.
func TestTraceKeepsTheLastEntries(t *testing.T) {
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
	n := nccl.MaxTraceEntries + 1000
	noErrors(t, runRanks(t, comms, func(c *nccl.LocalComm) error {
		for i := range n {
			if _, err := c.AllReduceInt64(fmt.Sprint("step", i%3), nccl.ReduceSum, []int64{1}); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, c := range comms {
		tr := c.Trace()
		if len(tr) != nccl.MaxTraceEntries {
			t.Fatalf("rank %d keeps %d entries, want %d", c.Rank(), len(tr), nccl.MaxTraceEntries)
		}
		for i, e := range tr {
			if want := n - nccl.MaxTraceEntries + i; e.Seq != want || e.Name != fmt.Sprint("step", want%3) {
				t.Fatalf("rank %d entry %d: %+v, want call %d", c.Rank(), i, e, want)
			}
		}
		c.ResetTrace()
		if tr := c.Trace(); tr != nil {
			t.Fatalf("after ResetTrace: %d entries", len(tr))
		}
	}
}
