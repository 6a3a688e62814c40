// comm_none.cpp: the communicator of a build without ENGINE_MPI. The entry
// points still link, so a program built against this library runs on one
// process and gets a message saying how to enable MPI.
#include "comm_mpi.h"
#include "status.h"

namespace lockstep {

std::unique_ptr<Communicator> open_mpi_world() {
  throw EngineError(ENG_UNSUPPORTED,
                    "this engine library was built without MPI: install Open MPI "
                    "(openmpi-bin libopenmpi-dev, or scripts/ensure-deps.sh) and rebuild with "
                    "`make` (ENGINE_MPI=auto) or cmake -DENGINE_MPI=ON");
}

}  // namespace lockstep
