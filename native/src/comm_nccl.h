// comm_nccl.h: the NCCL communicator behind eng_comm_init_nccl (engine.h).
//
// Defined by cuda/nccl_comm.cu in a build with ENGINE_NCCL; otherwise by
// comm_nccl_none.cpp, where both functions throw ENG_UNSUPPORTED, so the
// entry points link and answer cleanly in a CPU-only build.
#ifndef LOCKSTEP_NATIVE_COMM_NCCL_H
#define LOCKSTEP_NATIVE_COMM_NCCL_H

#include <cstdint>
#include <memory>

#include "comm_mpi.h"

namespace lockstep {

constexpr int kNcclIdBytes = 128;  // sizeof(ncclUniqueId)

// A fresh NCCL unique id (rank 0 makes it; the others receive it through the
// bootstrap transport).
void nccl_unique_id(uint8_t out[kNcclIdBytes]);

// Joins the NCCL group of `size` ranks named by id, as `rank`, on CUDA device
// `device` (its own stream). Every wait -- the group's creation and each
// collective -- is bounded by timeout_ms (> 0): past it the communicator is
// aborted (ncclCommAbort) and the call throws ENG_TIMEOUT naming the step, so
// a stuck peer never blocks the caller forever.
std::unique_ptr<Communicator> open_nccl_comm(const uint8_t id[kNcclIdBytes], int32_t rank, int32_t size,
                                             int32_t device, int32_t timeout_ms);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_COMM_NCCL_H
