// comm_mpi.cpp: the MPI communicator (built with ENGINE_MPI).
//
// One process-wide MPI session: the first communicator or exchange group
// initialises MPI unless the host program already did, asking for
// MPI_THREAD_MULTIPLE (the control plane's communicator is driven from one
// pinned Go thread, while the Helix and MoE exchanges of exchange groups run
// on engine threads, each group on a communicator of its own), and freeing
// the last of them finalises it again if this library initialised it. Each communicator is a
// duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so an MPI failure comes
// back as ENG_COMM_ERROR with MPI's error string instead of killing the job
// from inside a library call.
#include "comm_mpi.h"

// Only MPI's C API is used (its C++ bindings were removed in MPI-3, and
// Open MPI's would need libmpi_cxx at link time).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "mpi_session.h"
#include "status.h"

namespace lockstep {
namespace {

// Process-wide MPI state.
std::mutex g_mu;
int g_open_comms = 0;          // live communicators and exchange groups
bool g_we_initialised = false;  // MPI_Init_thread was ours: finalise with the last comm
int g_provided = -1;            // the thread level MPI provides

// Throws ENG_COMM_ERROR naming what failed and MPI's message, unless rc is
// MPI_SUCCESS.
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "MPI error %d", rc);
  throw EngineError(ENG_COMM_ERROR, std::string(what) + ": " + msg);
}

// Refuses calls from a thread other than the one that initialised MPI when
// MPI provides less than MPI_THREAD_MULTIPLE.
void require_main_thread(const char* what) {
  if (g_provided >= MPI_THREAD_MULTIPLE) return;
  int is_main = 0;
  check(MPI_Is_thread_main(&is_main), "MPI_Is_thread_main");
  if (!is_main)
    throw EngineError(ENG_INVALID_ARGUMENT,
                      std::string(what) +
                          ": called from a thread other than the one that initialised MPI "
                          "(the MPI library provides no MPI_THREAD_MULTIPLE); make every eng_comm "
                          "call from that thread");
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    lens_.resize(size_);
    counts_.resize(size_);
    displs_.resize(size_);
  }

  // Frees the duplicate and, with the last communicator, finalises MPI if we
  // initialised it. Errors here cannot be reported (destructor): the process
  // is leaving the group anyway.
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (bell_ != MPI_REQUEST_NULL && !finalized) {
      MPI_Cancel(&bell_);
      MPI_Wait(&bell_, MPI_STATUS_IGNORE);
    }
    mpi_release_comm(&comm_);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  const uint8_t* allgatherv(const void* send, int64_t send_len, bool send_ok,
                            int64_t* recv_lens) override {
    require_main_thread("eng_comm_allgatherv");
    // Phase 1: lengths. An invalid local argument travels as -1, so that the
    // whole group fails this call together.
    int64_t mine = send_ok ? send_len : -1;
    check(MPI_Allgather(&mine, 1, MPI_INT64_T, lens_.data(), 1, MPI_INT64_T, comm_),
          "MPI_Allgather (lengths)");
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      if (lens_[r] < 0)
        throw EngineError(ENG_INVALID_ARGUMENT,
                          "eng_comm_allgatherv: rank " + std::to_string(r) +
                              " passed invalid arguments (negative length, or NULL buffers)");
      counts_[r] = static_cast<int>(lens_[r] > INT_MAX ? INT_MAX : lens_[r]);
      displs_[r] = static_cast<int>(total > INT_MAX ? INT_MAX : total);
      total += lens_[r];
      if (total > INT_MAX)
        throw EngineError(ENG_INVALID_ARGUMENT,
                          "eng_comm_allgatherv: " + std::to_string(total) +
                              "+ bytes gathered exceed MPI's 2^31-1 byte count");
    }
    // Phase 2: data, into a buffer the communicator owns (never empty, so
    // that data() is a valid pointer even when every rank sends nothing).
    recv_.resize(static_cast<size_t>(total) + 1);
    static const uint8_t kEmpty = 0;
    check(MPI_Allgatherv(send_len > 0 ? send : &kEmpty, static_cast<int>(send_len), MPI_BYTE,
                         recv_.data(), counts_.data(), displs_.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
    for (int r = 0; r < size_; ++r) recv_lens[r] = lens_[r];
    return recv_.data();
  }

  void abort(int32_t code) override { check(MPI_Abort(comm_, code), "MPI_Abort"); }

  // The idle doorbell. MPI's blocking collectives poll their transports
  // while they wait, so a rank that enters the next collective of an idle
  // fleet holds a core until root (which sleeps until a request comes)
  // joins it. Instead root sends each other rank the number of this call
  // (eight bytes: an eager send, complete as soon as it returns), and the
  // others look for it, asleep in between, for at most timeout_us.
  // Numbering makes the doorbell safe after a timeout: the ring a rank gave
  // up on is found by its next call, which drops it as stale and waits for
  // its own. Point-to-point messages never match a
  // collective's, so the rings (and the receive left posted for the next
  // one) cannot disturb allgatherv.
  void idle_wait(int32_t root, int64_t poll_us, int64_t timeout_us) override {
    require_main_thread("eng_comm_idle_wait");
    if (root < 0 || root >= size_)
      throw EngineError(ENG_INVALID_ARGUMENT, "eng_comm_idle_wait: root " + std::to_string(root) +
                                                  " is outside the group of " + std::to_string(size_));
    if (poll_us <= 0 || timeout_us < 0)
      throw EngineError(ENG_INVALID_ARGUMENT, "eng_comm_idle_wait: poll_us must be positive and "
                                              "timeout_us not negative (got " +
                                                  std::to_string(poll_us) + ", " + std::to_string(timeout_us) + ")");
    const int64_t seq = ++idle_calls_;
    if (rank_ == root) {
      ring_ = seq;  // the send buffer outlives each MPI_Send
      for (int r = 0; r < size_; ++r)
        if (r != root) check(MPI_Send(&ring_, 1, MPI_INT64_T, r, kIdleTag, comm_), "MPI_Send (idle doorbell)");
      return;
    }
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::microseconds(timeout_us);
    // Naps grow from poll_us/8 to poll_us: a request that comes soon after
    // the fleet went idle (a client's next turn) is seen within a fraction
    // of the gap, a long idle spell wakes every poll_us.
    auto nap_for = std::chrono::microseconds(std::max<int64_t>(poll_us / 8, 1));
    const auto poll = std::chrono::microseconds(poll_us);
    for (;;) {
      // A posted receive: Open MPI's MPI_Iprobe saw a waiting ring 0.9 ms
      // late on average in the same loop (MPI_Test: 0.3 ms).
      if (bell_ == MPI_REQUEST_NULL)
        check(MPI_Irecv(&inbox_, 1, MPI_INT64_T, root, kIdleTag, comm_, &bell_), "MPI_Irecv (idle doorbell)");
      int done = 0;
      check(MPI_Test(&bell_, &done, MPI_STATUS_IGNORE), "MPI_Test (idle doorbell)");
      if (done) {
        if (inbox_ >= seq) return;
        continue;  // a ring an earlier call gave up on
      }
      const auto left = deadline - clock::now();
      if (left <= clock::duration::zero()) return;
      const auto nap = std::min<clock::duration>(left, nap_for);
      nap_for = std::min(nap_for * 2, poll);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      nanosleep(&ts, nullptr);
    }
  }

 private:
  static constexpr int kIdleTag = 0x1d1e;  // the doorbell's messages on comm_

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
  int64_t idle_calls_ = 0;  // eng_comm_idle_wait calls made on this rank
  int64_t ring_ = 0;        // root's send buffer
  // The receive of the next ring, posted by idle_wait and left posted when
  // it gives up (the next call finds the late ring there); inbox_ is its
  // buffer.
  MPI_Request bell_ = MPI_REQUEST_NULL;
  int64_t inbox_ = 0;
  std::vector<int64_t> lens_;
  std::vector<int> counts_, displs_;
  std::vector<uint8_t> recv_;
};

}  // namespace

void mpi_check(int rc, const char* what) { check(rc, what); }

int mpi_session_open() {
  std::lock_guard<std::mutex> lk(g_mu);
  int initialized = 0, finalized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  check(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized)
    throw EngineError(ENG_COMM_ERROR,
                      "MPI was already finalised in this process (the last communicator was "
                      "freed); MPI cannot be initialised twice: keep one communicator open");
  if (!initialized) {
    // Open MPI installs SIGSEGV/SIGBUS/SIGFPE/SIGABRT handlers for its
    // backtraces; in a Go process they would take the signals the Go runtime
    // uses (nil checks, preemption) and they are not installed on the
    // alternate signal stack Go requires. Keep a user's explicit choice.
    setenv("OMPI_MCA_opal_signal", "", 0);
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_we_initialised = true;
    if (provided < MPI_THREAD_FUNNELED)
      throw EngineError(ENG_COMM_ERROR, "the MPI library does not provide MPI_THREAD_FUNNELED");
  }
  if (g_provided < 0) check(MPI_Query_thread(&g_provided), "MPI_Query_thread");
  // Failures of a dup itself are reported through the world's handler.
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler(world)");
  return g_provided;
}

void mpi_adopt_comm() {
  std::lock_guard<std::mutex> lk(g_mu);
  ++g_open_comms;
}

void mpi_release_comm(MPI_Comm* comm) {
  std::lock_guard<std::mutex> lk(g_mu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  if (--g_open_comms == 0 && g_we_initialised) MPI_Finalize();
}

std::unique_ptr<Communicator> open_mpi_world() {
  mpi_session_open();
  require_main_thread("eng_comm_init_mpi");
  MPI_Comm dup = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup(world)");
  check(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_adopt_comm();
  try {
    // From here the destructor owns dup (and the finalise bookkeeping).
    return std::make_unique<MpiCommunicator>(dup);
  } catch (...) {
    mpi_release_comm(&dup);
    throw;
  }
}

}  // namespace lockstep
