// comm_nccl_none.cpp: the NCCL communicator of a build without ENGINE_NCCL
// (comm_nccl.h): the entry points link and answer ENG_UNSUPPORTED.
#include "comm_nccl.h"
#include "status.h"

namespace lockstep {
namespace {

[[noreturn]] void unsupported() {
  throw EngineError(ENG_UNSUPPORTED,
                    "this engine library was built without NCCL: the NCCL control-plane transport "
                    "needs cmake -DENGINE_CUDA=ON -DENGINE_NCCL=ON (scripts/install-cuda.sh installs "
                    "the toolchain); MPI and TCP remain the CPU transports");
}

}  // namespace

void nccl_unique_id(uint8_t*) { unsupported(); }

std::unique_ptr<Communicator> open_nccl_comm(const uint8_t*, int32_t, int32_t, int32_t, int32_t) {
  unsupported();
}

}  // namespace lockstep
