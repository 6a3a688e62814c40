//go:build !native

package native

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/nccl"
)

// OpenMPI would open the MPI transport of the native library; this build has
// no library, so it always fails.
func OpenMPI() (nccl.Transport, error) {
	return nil, fmt.Errorf("mpi transport: %w", errNotBuilt)
}
