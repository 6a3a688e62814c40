// comm_none.cpp: the communicator of a build without ENGINE_MPI. The entry
// points still link, so a program built against this library runs on one
// process and gets a message saying how to enable MPI.
#include "comm_mpi.h"
#include "cp_group.h"
#include "status.h"

namespace lockstep {

std::unique_ptr<Communicator> open_mpi_world() {
  throw EngineError(ENG_UNSUPPORTED,
                    "this engine library was built without MPI: install Open MPI "
                    "(openmpi-bin libopenmpi-dev, or scripts/ensure-deps.sh) and rebuild with "
                    "`make` (ENGINE_MPI=auto) or cmake -DENGINE_MPI=ON");
}

std::shared_ptr<ExchangeGroup> open_mpi_exchange_group(int32_t, std::chrono::milliseconds) {
  throw EngineError(ENG_UNSUPPORTED,
                    "this engine library was built without MPI, so engines in different processes "
                    "cannot exchange Helix or MoE data: install Open MPI (scripts/ensure-deps.sh) and "
                    "rebuild with `make` (ENGINE_MPI=auto) or cmake -DENGINE_MPI=ON");
}

}  // namespace lockstep
