package fleet

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/nccl"
)

// firstRootCause reports a failed run: the root cause first, then what
// every other rank saw. The root is the rank where the failure began: an
// error that is not a consequence of another rank's failure. A peer
// closing or the init vote relaying a failure elsewhere are consequences;
// so is a collective timeout when some rank failed for a reason of its own
// (a rank that stops entering collectives makes its peers time out before
// it is torn down and reports why). Only when every error is a consequence
// does the first timeout, then the first error, lead.
func firstRootCause(errs []error) error {
	root := -1
	for _, consequence := range []func(error) bool{
		func(err error) bool {
			// An engine's exchange group (Helix, MoE) times out or is
			// aborted when a peer stops: a consequence too.
			return errors.Is(err, nccl.ErrClosed) || errors.Is(err, executor.ErrInitFailedElsewhere) ||
				errors.Is(err, nccl.ErrTimeout) || errors.Is(err, bridge.ErrTimeout) || errors.Is(err, bridge.ErrCommError)
		},
		func(err error) bool { return !errors.Is(err, nccl.ErrTimeout) && !errors.Is(err, bridge.ErrTimeout) },
		func(error) bool { return false },
	} {
		for i, err := range errs {
			if err != nil && !consequence(err) {
				root = i
				break
			}
		}
		if root >= 0 {
			break
		}
	}
	if root < 0 {
		return nil
	}
	var others []string
	for i, err := range errs {
		if err != nil && i != root {
			others = append(others, fmt.Sprintf("rank %d: %v", i, err))
		}
	}
	if len(others) == 0 {
		return errs[root]
	}
	return fmt.Errorf("%w\nother ranks:\n  %s", errs[root], strings.Join(others, "\n  "))
}
