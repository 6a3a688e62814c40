package executor

import (
	"errors"
	"fmt"

	"github.com/lockstep-ai/lockstep/nccl"
)

// InitStatus is a rank's initialisation outcome (kvcache.md §3.5), ordered
// by severity so that the world's MAX is the worst.
type InitStatus int64

// Initialisation statuses.
const (
	InitOK        InitStatus = 0
	InitUseNoHost InitStatus = 1 // the host tier could not be built
	InitAbort     InitStatus = 2 // anything else failed
)

// ErrInitFailedElsewhere is what a rank whose own initialisation succeeded
// reports when another rank's failed.
var ErrInitFailedElsewhere = errors.New("KV cache manager initialisation failed on another rank")

// InitVote is I1: every rank contributes its status, the world takes the
// MAX, and every rank learns the worst outcome before any rank reaches the
// loop, so one failing rank aborts all of them instead of leaving its peers
// blocked in the first collective. localErr is this rank's own failure (nil
// on success); the returned error is localErr on the failing rank and
// ErrInitFailedElsewhere on the others. comm may be nil for one rank.
func InitVote(comm nccl.Comm, status InitStatus, localErr error) (InitStatus, error) {
	world := status
	if comm != nil && comm.Size() > 1 {
		got, err := comm.AllReduceInt64("init_status", nccl.ReduceMax, []int64{int64(status)})
		if err != nil {
			return InitAbort, fmt.Errorf("initialisation vote: %w", err)
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
