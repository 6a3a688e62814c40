//go:build !native

package native

import (
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/nccl"
)

// OpenMPI would open the MPI transport of the native library; this build has
// no library, so it always fails.
func OpenMPI() (nccl.Transport, error) {
	return nil, fmt.Errorf("mpi transport: %w", errNotBuilt)
}

// NCCLUniqueID would make an NCCL unique id; this build has no library.
func NCCLUniqueID() ([]byte, error) {
	return nil, fmt.Errorf("nccl unique id: %w", errNotBuilt)
}

// OpenNCCL would open the NCCL transport; this build has no library.
func OpenNCCL(id []byte, rank, size, device int, timeout time.Duration) (nccl.Transport, error) {
	return nil, fmt.Errorf("nccl init: %w", errNotBuilt)
}

// NCCLGroupOptions returns options whose functions fail: this build has no
// library.
func NCCLGroupOptions(device int, timeout time.Duration) *nccl.NCCLOptions {
	return &nccl.NCCLOptions{
		UniqueID: NCCLUniqueID,
		Open: func(id []byte, rank, size int) (nccl.Transport, error) {
			return OpenNCCL(id, rank, size, device, timeout)
		},
	}
}
