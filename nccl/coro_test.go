package nccl

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCoroGroupCollectives(t *testing.T) {
	const n = 5
	g := NewCoroGroup(n, true)
	got := make([][]string, n)
	errs := RunCoroutines(g, func(rank int, c *CoroComm) error {
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
	g := NewCoroGroup(3, false)
	errs := RunCoroutines(g, func(rank int, c *CoroComm) error {
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
	errs = RunCoroutines(g, func(rank int, c *CoroComm) error {
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
		b.Run(fmt.Sprintf("coroutines/%d", n), func(b *testing.B) {
			g := NewCoroGroup(n, false)
			b.ResetTimer()
			errs := RunCoroutines(g, func(rank int, c *CoroComm) error {
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

// TestCoroAllGatherDecodedRunsOnce: the group decodes once and every member
// receives the same value; a decode error reaches every member.
func TestCoroAllGatherDecodedRunsOnce(t *testing.T) {
	g := NewCoroGroup(4, false)
	calls := 0
	got := make([]any, 4)
	errs := RunCoroutines(g, func(rank int, c *CoroComm) error {
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
