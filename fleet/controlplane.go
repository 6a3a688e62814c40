package fleet

import (
	"time"

	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/nccl"
)

// controlPlaneNCCL picks the NCCL transport for the world's collectives
// (DESIGN.md §5: event flush and schedule check ride NCCL on GPU
// deployments): with --engine cuda, on the rank's device (its local rank),
// falling back on every rank to MPI/TCP when the library has no NCCL. Other
// engines keep the CPU transports (nil). The native waits are bounded by the
// watchdog's timeout plus a margin, so the watchdog names a stuck collective
// first and ncclCommAbort is only the backstop.
func controlPlaneNCCL(engine string, localRank int, collectiveTimeout time.Duration) *nccl.NCCLOptions {
	if engine != "cuda" {
		return nil
	}
	o := nativeengine.NCCLGroupOptions(localRank, nativeNCCLTimeout(collectiveTimeout))
	o.Fallback = true
	return o
}

// nativeNCCLTimeout is the bound of the native NCCL waits for a watchdog
// timeout (0: the watchdog is off, so ten minutes).
func nativeNCCLTimeout(collectiveTimeout time.Duration) time.Duration {
	if collectiveTimeout <= 0 {
		return 10 * time.Minute
	}
	return collectiveTimeout + 30*time.Second
}
