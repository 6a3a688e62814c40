// comm_mpi.h: the communicator behind the eng_comm_* entry points.
//
// comm_api.cpp owns the C ABI (handles, try/catch, last error); a
// Communicator is the transport it drives. comm_mpi.cpp implements it with
// MPI when the library is built with ENGINE_MPI; comm_none.cpp otherwise, and
// there open_mpi_world throws ENG_UNSUPPORTED. Failures are thrown as
// EngineError (status.h) and never leave comm_api.cpp as exceptions.
#ifndef LOCKSTEP_NATIVE_COMM_MPI_H
#define LOCKSTEP_NATIVE_COMM_MPI_H

#include <cstdint>
#include <memory>

namespace lockstep {

// Communicator is one member's handle on a process group. Not thread-safe:
// the caller serialises calls (and, for MPI, makes them from the thread that
// initialised MPI).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  // Variable-size allgather (engine.h, eng_comm_allgatherv). send_ok = false
  // marks this rank's arguments as invalid: the call still joins the length
  // exchange (so no peer is left waiting) and then fails on every rank.
  // recv_lens receives size() lengths; the returned pointer is valid until the
  // next call or destruction.
  virtual const uint8_t* allgatherv(const void* send, int64_t send_len, bool send_ok,
                                    int64_t* recv_lens) = 0;
  // Terminates the whole job; returns only if that failed (throws).
  virtual void abort(int32_t code) = 0;
  // The idle doorbell (engine.h, eng_comm_idle_wait). A transport whose
  // waits cost no CPU has nothing to save and returns at once.
  virtual void idle_wait(int32_t root, int64_t poll_us, int64_t timeout_us) {
    (void)root;
    (void)poll_us;
    (void)timeout_us;
  }
};

// Returns a communicator over every process of the job (MPI_COMM_WORLD,
// duplicated), initialising MPI on first use.
std::unique_ptr<Communicator> open_mpi_world();

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_COMM_MPI_H
