package executor

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// onRanks runs fn on every member of a fresh local group and returns the
// errors and the comms (for their traces).
func onRanks(n int, fn func(rank int, c nccl.Comm) error) ([]error, []*nccl.LocalComm) {
	comms := nccl.NewLocalGroup(n, nccl.LocalOptions{Timeout: 5 * time.Second})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range comms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = fn(i, comms[i])
		}(i)
	}
	wg.Wait()
	return errs, comms
}

// helixOutput is a small pass: one context chunk, one generation step, one
// recompute-paused request.
func helixOutput() (*scheduler.Output, map[uint64]int) {
	ctx := &scheduler.Request{ID: 1, Tokens: []int32{5, 6, 7, 8}, PromptLen: 4, ChunkSize: 4, TotalInputLenCP: 4}
	gen := &scheduler.Request{ID: 2, HelixDecodeCount: 3, TotalInputLenCP: 16}
	paused := &scheduler.Request{ID: 3}
	out := &scheduler.Output{Context: []*scheduler.Request{ctx}, Generation: []*scheduler.Request{gen},
		RecomputePaused: []*scheduler.Request{paused}}
	return out, map[uint64]int{2: 20}
}

func capOf(m map[uint64]int) func(uint64) int { return func(id uint64) int { return m[id] } }

func TestScheduleCheckIdenticalSchedules(t *testing.T) {
	// P-14: 100 identical iterations, exactly one 32-byte allgather each.
	errs, comms := onRanks(2, func(rank int, c nccl.Comm) error {
		for it := int64(0); it < 100; it++ {
			out, caps := helixOutput()
			if err := checkSchedule(c, summarize(it, out, capOf(caps))); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, errors.Join(errs...))
	for _, c := range comms {
		tr := c.Trace()
		require.Len(t, tr, 100)
		for _, e := range tr {
			require.Equal(t, "allgather:schedule_digest", e.String())
		}
	}
	require.Equal(t, comms[0].Trace(), comms[1].Trace())
}

func TestScheduleCheckDivergence(t *testing.T) {
	cases := []struct {
		name    string
		perturb func(out *scheduler.Output, caps map[uint64]int)
		want    string
	}{
		// P-15: rank 1 picks a different recompute victim.
		{"victim", func(out *scheduler.Output, _ map[uint64]int) {
			out.RecomputePaused = []*scheduler.Request{{ID: 9}}
		}, "recompute-paused ids differs: rank 0 [3], rank 1 [9]"},
		// P-16: g of one scheduled generation differs.
		{"g", func(out *scheduler.Output, _ map[uint64]int) { out.Generation[0].HelixDecodeCount = 4 },
			"g of generation entry 0 (request 2) differs: rank 0 3, rank 1 4"},
		// P-17: one prompt token differs.
		{"token", func(out *scheduler.Output, _ map[uint64]int) { out.Context[0].Tokens = []int32{5, 6, 7, 9} },
			"token-list digest of context entry 0 (request 1) differs"},
		{"capacity", func(_ *scheduler.Output, caps map[uint64]int) { caps[2] = 24 },
			"ledger capacity of generation entry 0 (request 2) differs: rank 0 20, rank 1 24"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs, comms := onRanks(2, func(rank int, cm nccl.Comm) error {
				out, caps := helixOutput()
				if rank == 1 {
					c.perturb(out, caps)
				}
				return checkSchedule(cm, summarize(7, out, capOf(caps)))
			})
			for r, err := range errs {
				require.ErrorIs(t, err, ErrScheduleDivergence, "rank %d", r)
				require.ErrorContains(t, err, "at iteration 7")
				require.ErrorContains(t, err, c.want, "rank %d", r)
			}
			require.Equal(t, comms[0].Trace(), comms[1].Trace())
			require.Len(t, comms[0].Trace(), 2, "digest allgather, then the full summary allgather")
		})
	}
}

func TestScheduleCheckIncompletePrompt(t *testing.T) {
	// P-18: a context request holds 24 tokens while TotalInputLenCP = 25.
	errs, _ := onRanks(2, func(rank int, c nccl.Comm) error {
		r := &scheduler.Request{ID: 4, Tokens: make([]int32, 24), PromptLen: 24, TotalInputLenCP: 25, ChunkSize: 24}
		return checkSchedule(c, summarize(0, &scheduler.Output{Context: []*scheduler.Request{r}}, capOf(nil)))
	})
	for _, err := range errs {
		require.ErrorIs(t, err, ErrIncompletePrompt)
		require.ErrorContains(t, err, "(24 of 25 tokens)")
	}
}

func TestScheduleCheckGate(t *testing.T) {
	// P-19.
	for _, c := range []struct {
		v         string
		helix     bool
		cp, pp    int
		on        bool
		warnsWith string
	}{
		{"1", true, 1, 1, false, "cp_size is 1"},
		{"1", false, 2, 1, false, "Helix is off"},
		{"1", true, 2, 2, false, "pp_size is 2"},
		{"", true, 2, 1, false, ""},
		{"1", true, 2, 1, true, ""},
	} {
		on, warn := ScheduleCheckGate(c.v, c.helix, c.cp, c.pp)
		require.Equal(t, c.on, on, "%+v", c)
		if c.warnsWith == "" {
			require.Empty(t, warn)
		} else {
			require.Contains(t, warn, c.warnsWith)
			require.Contains(t, warn, "does not apply")
		}
	}
	// P-20: set on rank 0 only → both fail at start-up.
	errs, _ := onRanks(2, func(rank int, c nccl.Comm) error { return AgreeScheduleCheck(c, rank == 0) })
	for _, err := range errs {
		require.ErrorContains(t, err, "must be set identically on every CP rank")
	}
	errs, _ = onRanks(2, func(rank int, c nccl.Comm) error { return AgreeScheduleCheck(c, true) })
	require.NoError(t, errors.Join(errs...))
}

func TestInitVote(t *testing.T) {
	// P-22: rank 1's pool allocation fails; rank 0 raises "failed on another
	// rank", rank 1 its own error; neither gets further.
	boom := errors.New("pool allocation failed: out of memory")
	errs, comms := onRanks(2, func(rank int, c nccl.Comm) error {
		st, err := InitOK, error(nil)
		if rank == 1 {
			st, err = InitAbort, boom
		}
		got, err := InitVote(c, st, err)
		require.Equal(t, InitAbort, got)
		return err
	})
	require.ErrorIs(t, errs[0], ErrInitFailedElsewhere)
	require.ErrorIs(t, errs[1], boom)
	require.Equal(t, comms[0].Trace(), comms[1].Trace())
	errs, _ = onRanks(3, func(rank int, c nccl.Comm) error {
		got, err := InitVote(c, InitOK, nil)
		require.Equal(t, InitOK, got)
		return err
	})
	require.NoError(t, errors.Join(errs...))
}
