package executor

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// TestInitVoteAcceptsExactlyItsTwoValues: the executor's vote knows OK and
// ABORT only. A rank that brings anything else fails every rank (it
// contributes ABORT) and names what it brought; a world result that is
// neither (a peer that is not running this vote) is an error naming the
// value received, never a success.
func TestInitVoteAcceptsExactlyItsTwoValues(t *testing.T) {
	for _, bad := range []InitStatus{1, -1, 3, 1 << 40} {
		errs, _ := onRanks(2, func(rank int, c nccl.Comm) error {
			st := InitOK
			if rank == 1 {
				st = bad
			}
			got, err := InitVote(c, st, nil)
			require.Equal(t, InitAbort, got)
			return err
		})
		require.ErrorIs(t, errs[0], ErrInitFailedElsewhere, "status %d", bad)
		require.ErrorContains(t, errs[1], "initialisation vote")
		require.ErrorContains(t, errs[1], "local status", "status %d", bad)
		require.ErrorContains(t, errs[1], "want 0 (OK) or 2 (ABORT)")
		// One rank alone validates its own status too.
		_, err := InitVote(nil, bad, nil)
		require.ErrorContains(t, err, "want 0 (OK) or 2 (ABORT)")
	}
	for _, raw := range []int64{1, 7, -4} {
		errs, _ := onRanks(2, func(rank int, c nccl.Comm) error {
			if rank == 1 { // a peer that does not speak this vote
				_, err := c.AllReduceInt64("init_status", nccl.ReduceMax, []int64{raw})
				return err
			}
			got, err := InitVote(c, InitOK, nil)
			if raw > 0 {
				require.Equal(t, InitAbort, got)
			}
			return err
		})
		if raw > 0 {
			require.ErrorContains(t, errs[0], "received")
			require.ErrorContains(t, errs[0], "want 0 (OK) or 2 (ABORT)")
			require.False(t, errors.Is(errs[0], ErrInitFailedElsewhere))
		} else {
			// MAX(OK, -4) = OK: the negative value is invisible to rank 0,
			// whose own status won; only the sender could have noticed.
			require.NoError(t, errs[0])
		}
	}
}

// TestParseScheduleCheckEnv: the variable accepts "1" (on), and "" or "0"
// (off); anything else is an error naming the variable and the allowed
// values, never a silent off.
func TestParseScheduleCheckEnv(t *testing.T) {
	for _, c := range []struct {
		v   string
		on  bool
		bad bool
	}{{"", false, false}, {"0", false, false}, {"1", true, false},
		{"garbage", false, true}, {"true", false, true}, {" 1", false, true}, {"2", false, true}} {
		on, err := ParseScheduleCheckEnv(c.v)
		if c.bad {
			require.ErrorContains(t, err, ScheduleCheckEnv, c.v)
			require.ErrorContains(t, err, `"1"`)
			require.ErrorContains(t, err, `"0"`)
			continue
		}
		require.NoError(t, err, c.v)
		require.Equal(t, c.on, on, c.v)
	}
}
