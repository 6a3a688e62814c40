// comm_api.cpp: the eng_comm_* entry points of engine.h.
//
// Every entry point validates its handle, runs inside a try/catch (no
// exception crosses the C ABI) and stores a failure's message as the
// handle's last error, or the thread's for eng_comm_init_mpi. The transport
// itself is a lockstep::Communicator (comm_mpi.h): MPI with ENGINE_MPI, a
// stub answering ENG_UNSUPPORTED without.
#include <memory>
#include <new>
#include <string>

#include "comm_mpi.h"
#include "comm_nccl.h"
#include "engine.h"
#include "status.h"

struct eng_comm {
  std::unique_ptr<lockstep::Communicator> impl;
  std::string last_error;
};

namespace {

// The last failed eng_comm_init_mpi of this thread (eng_comm_last_error(NULL)).
thread_local std::string g_comm_init_error;

// Runs body, converting any exception into a status and a message stored in
// *err; storing the message cannot throw out of here.
template <class Body>
eng_status comm_guarded(std::string* err, Body&& body) {
  eng_status status = ENG_INTERNAL;
  std::string msg;
  try {
    body();
    return ENG_OK;
  } catch (const lockstep::EngineError& e) {
    status = e.status();
    try { msg = e.what(); } catch (...) {}
  } catch (const std::bad_alloc&) {
    status = ENG_OUT_OF_MEMORY;
    try { msg = "out of host memory"; } catch (...) {}
  } catch (const std::exception& e) {
    try { msg = std::string("internal error: ") + e.what(); } catch (...) {}
  } catch (...) {
    try { msg = "internal error: unknown exception"; } catch (...) {}
  }
  try {
    *err = msg;
  } catch (...) {
    err->clear();
  }
  return status;
}

}  // namespace

extern "C" {

eng_status eng_comm_init_mpi(eng_comm_t* out) {
  return comm_guarded(&g_comm_init_error, [&] {
    if (out == nullptr) lockstep::invalid_argument("eng_comm_init_mpi: out is NULL");
    *out = nullptr;
    auto comm = std::make_unique<eng_comm>();
    comm->impl = lockstep::open_mpi_world();
    *out = comm.release();
  });
}

int32_t eng_comm_rank(eng_comm_t comm) { return comm == nullptr ? -1 : comm->impl->rank(); }

int32_t eng_comm_size(eng_comm_t comm) { return comm == nullptr ? -1 : comm->impl->size(); }

eng_status eng_comm_allgatherv(eng_comm_t comm, const void* send, int64_t send_len,
                               int64_t* recv_lens, const uint8_t** recv) {
  if (comm == nullptr) {
    g_comm_init_error = "eng_comm_allgatherv: communicator handle is NULL";
    return ENG_INVALID_ARGUMENT;
  }
  return comm_guarded(&comm->last_error, [&] {
    // Bad local arguments still join the exchange (see Communicator).
    bool ok = send_len >= 0 && (send != nullptr || send_len == 0) && recv_lens != nullptr &&
              recv != nullptr;
    // With !ok the call throws on every rank before touching the outputs.
    const uint8_t* data = comm->impl->allgatherv(send, ok ? send_len : 0, ok, recv_lens);
    *recv = data;
  });
}

eng_status eng_comm_abort(eng_comm_t comm, int32_t code) {
  if (comm == nullptr) {
    g_comm_init_error = "eng_comm_abort: communicator handle is NULL";
    return ENG_INVALID_ARGUMENT;
  }
  return comm_guarded(&comm->last_error, [&] { comm->impl->abort(code); });
}

eng_status eng_comm_idle_wait(eng_comm_t comm, int32_t root, int64_t poll_us, int64_t timeout_us) {
  if (comm == nullptr) {
    g_comm_init_error = "eng_comm_idle_wait: communicator handle is NULL";
    return ENG_INVALID_ARGUMENT;
  }
  return comm_guarded(&comm->last_error, [&] { comm->impl->idle_wait(root, poll_us, timeout_us); });
}

eng_status eng_comm_free(eng_comm_t comm) {
  delete comm;  // the Communicator's destructor never throws
  return ENG_OK;
}

const char* eng_comm_last_error(eng_comm_t comm) {
  return comm == nullptr ? g_comm_init_error.c_str() : comm->last_error.c_str();
}

eng_status eng_comm_nccl_unique_id(uint8_t out[ENG_NCCL_UNIQUE_ID_BYTES]) {
  return comm_guarded(&g_comm_init_error, [&] {
    if (out == nullptr) lockstep::invalid_argument("eng_comm_nccl_unique_id: out is NULL");
    lockstep::nccl_unique_id(out);
  });
}

eng_status eng_comm_init_nccl(const uint8_t id[ENG_NCCL_UNIQUE_ID_BYTES], int32_t rank, int32_t size,
                              int32_t device_id, int32_t timeout_ms, eng_comm_t* out) {
  return comm_guarded(&g_comm_init_error, [&] {
    if (out == nullptr) lockstep::invalid_argument("eng_comm_init_nccl: out is NULL");
    *out = nullptr;
    if (id == nullptr) lockstep::invalid_argument("eng_comm_init_nccl: id is NULL");
    auto comm = std::make_unique<eng_comm>();
    comm->impl = lockstep::open_nccl_comm(id, rank, size, device_id, timeout_ms);
    *out = comm.release();
  });
}

}  // extern "C"
