package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runCoro is RunCoroutines (workers 1) or RunCoroutinesParallel.
func runCoro(g *CoroGroup, workers int, body func(rank int, c *CoroComm) error) []error {
	if workers == 1 {
		return RunCoroutines(g, body)
	}
	if workers%2 == 0 {
		// Unlocked workers, called from a locked thread (as the fleet does).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		return RunCoroutinesParallel(g, workers, false, body)
	}
	return RunCoroutinesParallel(g, workers, true, body)
}

func TestCoroGroupCollectives(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) { testCoroGroupCollectives(t, workers) })
	}
}

func testCoroGroupCollectives(t *testing.T, workers int) {
	const n = 5
	g := NewCoroGroup(n, true)
	got := make([][]string, n)
	errs := runCoro(g, workers, func(rank int, c *CoroComm) error {
		for it := 0; it < 3; it++ {
			all, err := c.AllGather("g", []byte(fmt.Sprintf("r%d-%d", rank, it)))
			if err != nil {
				return err
			}
			for _, b := range all {
				got[rank] = append(got[rank], string(b))
			}
			b, err := c.Broadcast("b", 2, []byte(fmt.Sprintf("root%d", rank)))
			if err != nil {
				return err
			}
			got[rank] = append(got[rank], string(b))
			s, err := c.AllReduceInt64("s", ReduceMax, []int64{int64(rank), int64(-rank)})
			if err != nil {
				return err
			}
			got[rank] = append(got[rank], fmt.Sprint(s))
		}
		return nil
	})
	require.NoError(t, errors.Join(errs...))
	for r := 1; r < n; r++ {
		require.Equal(t, got[0], got[r])
	}
	require.Equal(t, []string{"r0-0", "r1-0", "r2-0", "r3-0", "r4-0", "root2", "[4 0]"}, got[0][:7])
	require.Equal(t, 9, g.Calls())
	require.Len(t, g.Trace(), 9)
}

func TestCoroGroupMismatchAndEarlyExit(t *testing.T) {
	for _, workers := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) { testCoroGroupMismatchAndEarlyExit(t, workers) })
	}
}

func testCoroGroupMismatchAndEarlyExit(t *testing.T, workers int) {
	g := NewCoroGroup(3, false)
	errs := runCoro(g, workers, func(rank int, c *CoroComm) error {
		name := "a"
		if rank == 1 {
			name = "b"
		}
		_, err := c.AllGather(name, nil)
		return err
	})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrMismatch, "rank %d", r)
		require.ErrorContains(t, err, "allgather:b")
	}

	g = NewCoroGroup(3, false)
	errs = runCoro(g, workers, func(rank int, c *CoroComm) error {
		if rank == 2 {
			return nil // leaves without entering
		}
		_, err := c.AllGather("x", nil)
		return err
	})
	require.NoError(t, errs[2])
	require.ErrorIs(t, errs[0], ErrClosed)
	require.ErrorIs(t, errs[1], ErrClosed)
	require.ErrorContains(t, errs[0], "rank 2 left the group")
}

// BenchmarkCollectiveRound: one iteration-like round of collectives (two
// allgathers, a broadcast, an allreduce) over n members, goroutine group vs
// coroutine group. The coroutine group is what the twin's fleets use.
func BenchmarkCollectiveRound(b *testing.B) {
	round := func(c Comm, rank int) error {
		if _, err := c.AllGather("state", make([]byte, 64)); err != nil {
			return err
		}
		if _, err := c.Broadcast("count", 0, make([]byte, 16)); err != nil {
			return err
		}
		if _, err := c.AllGather("batch", make([]byte, 8)); err != nil {
			return err
		}
		_, err := c.AllReduceInt64("t", ReduceMax, []int64{int64(rank)})
		return err
	}
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("goroutines/%d", n), func(b *testing.B) {
			comms := NewLocalGroup(n, LocalOptions{Timeout: time.Minute})
			var wg sync.WaitGroup
			b.ResetTimer()
			for r, c := range comms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < b.N; i++ {
						if err := round(c, r); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("coroutines/%d/workers=%d", n, workers), func(b *testing.B) {
				g := NewCoroGroup(n, false)
				b.ResetTimer()
				errs := runCoro(g, workers, func(rank int, c *CoroComm) error {
					for i := 0; i < b.N; i++ {
						if err := round(c, rank); err != nil {
							return err
						}
					}
					return nil
				})
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// TestCoroAllGatherDecodedRunsOnce: the group decodes once and every member
// receives the same value; a decode error reaches every member.
func TestCoroAllGatherDecodedRunsOnce(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) { testCoroAllGatherDecodedRunsOnce(t, workers) })
	}
}

func testCoroAllGatherDecodedRunsOnce(t *testing.T, workers int) {
	g := NewCoroGroup(4, false)
	calls := 0
	got := make([]any, 4)
	errs := runCoro(g, workers, func(rank int, c *CoroComm) error {
		v, err := c.AllGatherDecoded("x", []byte{byte(rank)}, func(all [][]byte) (any, error) {
			calls++
			s := 0
			for _, b := range all {
				s += int(b[0])
			}
			return s, nil
		})
		got[rank] = v
		if err != nil {
			return err
		}
		_, err = c.AllGatherDecoded("y", nil, func([][]byte) (any, error) { return nil, errors.New("bad payload") })
		return err
	})
	require.Equal(t, 1, calls)
	require.Equal(t, []any{6, 6, 6, 6}, got)
	for _, err := range errs {
		require.ErrorContains(t, err, "bad payload")
	}
}

// TestCoroParallelMembersRunConcurrently: with two workers, members of
// different workers run between collectives at the same time (each waits
// for the other inside one round, which a single driver would deadlock on),
// and a long round (a worker sleeping past the spin) still completes.
func TestCoroParallelMembersRunConcurrently(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two processors")
	}
	g := NewCoroGroup(2, false)
	var flag [2]atomic.Bool
	errs := RunCoroutinesParallel(g, 2, false, func(rank int, c *CoroComm) error {
		for round := 0; round < 50; round++ {
			flag[rank].Store(true)
			deadline := time.Now().Add(10 * time.Second)
			for !flag[1-rank].Load() {
				if time.Now().After(deadline) {
					return fmt.Errorf("rank %d: the other worker never ran in round %d", rank, round)
				}
			}
			if round%10 == 0 && rank == 1 {
				time.Sleep(2 * time.Millisecond) // the other worker falls asleep
			}
			if _, err := c.AllGather("a", []byte{byte(round)}); err != nil {
				return err
			}
			flag[rank].Store(false)
			if _, err := c.AllReduceInt64("b", ReduceSum, []int64{1}); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, 100, g.Calls())
}

// Shared makes one value per group and key, whichever member asks first and
// from whichever worker; slots in it that each member fills with its own
// part before a collective are every member's to read after it (the
// executor's fleetSlots), here checked under -race on several workers.
func TestCoroSharedIsOnePerGroup(t *testing.T) {
	for _, workers := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			const n = 6
			g := NewCoroGroup(n, false)
			var made atomic.Int32
			got := make([]*[2][n]int, n)
			errs := runCoro(g, workers, func(rank int, c *CoroComm) error {
				slots := c.Shared("slots", func() any { made.Add(1); return new([2][n]int) }).(*[2][n]int)
				got[rank] = slots
				for round := 0; round < 20; round++ {
					half := &slots[round%2]
					half[rank] = 100*round + rank // this member's part, before the collective
					if _, err := c.AllGather("round", nil); err != nil {
						return err
					}
					for r, v := range half {
						if v != 100*round+r {
							return fmt.Errorf("rank %d round %d: slot %d is %d", rank, round, r, v)
						}
					}
				}
				return nil
			})
			require.NoError(t, errors.Join(errs...))
			require.Equal(t, int32(1), made.Load())
			for _, s := range got {
				require.Same(t, got[0], s)
			}
			require.NotSame(t, got[0], NewCoroGroup(1, false).Member(0).Shared("slots", func() any { return new([2][n]int) }))
		})
	}
}
