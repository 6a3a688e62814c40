package executor

import (
	"errors"
	"fmt"

	"github.com/lockstep-ai/lockstep/nccl"
)

// InitStatus is a rank's initialisation outcome (kvcache.md §3.5), ordered
// by severity so that the world's MAX is the worst.
//
// The executor's vote has exactly two values, as on the GPU-only
// aggregated-Helix path (§3.5: "the only possible outcomes are OK and
// ABORT"): it builds no host tier to fall back from, so the spec's
// USE_NO_HOST (1) is not one of them (kvpool.InitVote runs the three-value
// vote with the host-tier rebuild).
type InitStatus int64

// Initialisation statuses.
const (
	InitOK    InitStatus = 0
	InitAbort InitStatus = 2 // anything failed
)

// ErrInitFailedElsewhere is what a rank whose own initialisation succeeded
// reports when another rank's failed.
var ErrInitFailedElsewhere = errors.New("KV cache manager initialisation failed on another rank")

// valid reports whether s is one of the vote's two values.
func (s InitStatus) valid() bool { return s == InitOK || s == InitAbort }

// InitVote is I1: every rank contributes its status, the world takes the
// MAX, and every rank learns the worst outcome before any rank reaches the
// loop, so one failing rank aborts all of them instead of leaving its peers
// blocked in the first collective. localErr is this rank's own failure (nil
// on success); the returned error is localErr on the failing rank and
// ErrInitFailedElsewhere on the others. comm may be nil for one rank.
//
// Only InitOK and InitAbort are accepted. A rank passing anything else
// contributes InitAbort (so every rank fails, in the same collective) and
// returns an error naming its status; a world result that is neither (a
// peer that does not run this vote) is an error naming the value received.
func InitVote(comm nccl.Comm, status InitStatus, localErr error) (InitStatus, error) {
	if !status.valid() {
		localErr = fmt.Errorf("initialisation vote: local status %d, want 0 (OK) or 2 (ABORT)", int64(status))
		status = InitAbort
	}
	world := status
	if comm != nil && comm.Size() > 1 {
		got, err := comm.AllReduceInt64("init_status", nccl.ReduceMax, []int64{int64(status)})
		if err != nil {
			return InitAbort, fmt.Errorf("initialisation vote: %w", err)
		}
		if len(got) != 1 || !InitStatus(got[0]).valid() {
			return InitAbort, fmt.Errorf("initialisation vote: received %v from the world's MAX, want 0 (OK) or 2 (ABORT); "+
				"is every rank running the same worker build?", got)
		}
		world = InitStatus(got[0])
	}
	if world == InitAbort {
		if localErr != nil {
			return world, localErr
		}
		return world, ErrInitFailedElsewhere
	}
	return world, nil
}
