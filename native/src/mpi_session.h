// mpi_session.h: the process-wide MPI session shared by the control plane's
// communicator (comm_mpi.cpp) and the engines' exchange groups
// (exchange_mpi.cpp). MPI builds only (ENGINE_MPI).
#ifndef LOCKSTEP_NATIVE_MPI_SESSION_H
#define LOCKSTEP_NATIVE_MPI_SESSION_H

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace lockstep {

// Initialises MPI unless it is (asking for MPI_THREAD_MULTIPLE) and returns
// the thread level it provides. Throws ENG_COMM_ERROR after a finalise.
int mpi_session_open();
// Counts a communicator the caller created (after mpi_session_open).
void mpi_adopt_comm();
// Frees *comm (unless null) and, with the last one, finalises MPI if this
// library initialised it. Never throws.
void mpi_release_comm(MPI_Comm* comm);
// Throws ENG_COMM_ERROR naming `what` and MPI's message unless rc is
// MPI_SUCCESS.
void mpi_check(int rc, const char* what);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_MPI_SESSION_H
