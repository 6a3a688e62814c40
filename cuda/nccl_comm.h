// nccl_comm.h: the engine-side NCCL communicator behind nccl.Comm
// (DESIGN.md §5): collectives of host byte buffers staged through device
// buffers owned here, on one stream, with bounded waits.
//
// Its C ABI is eng_comm_init_nccl / eng_comm_nccl_unique_id (engine.h), which
// wrap it as a lockstep::Communicator (comm_nccl.h, open_nccl_comm): the Go
// side's checked collective protocol then runs over it exactly as over MPI
// or TCP (nccl.OpenProcessGroup with GroupOptions.OpenNCCL). The unique id
// (ncclUniqueId, 128 bytes) travels through the Go bootstrap (the MPI or TCP
// transport) as plain bytes.
//
// Bounded waits. The communicator is created non-blocking (ncclConfig_t
// blocking = 0) and every wait polls: the group's creation and the issue of
// each collective (ncclCommGetAsyncError until it leaves ncclInProgress: a
// non-blocking collective may return before it is on the stream, so the copy
// of its result to the host, or the next NCCL call, is queued only after
// that), then each collective's completion (cudaStreamQuery, and
// ncclCommGetAsyncError for a failed peer). Past timeout_ms the communicator is aborted (ncclCommAbort:
// the queued NCCL kernels return) and the call throws ENG_TIMEOUT naming the
// collective; the communicator is unusable afterwards. The Go watchdog's own
// timeout should be shorter, so that it reports the stuck collective (with
// every peer's last entry) before this backstop fires.
#ifndef LOCKSTEP_CUDA_NCCL_COMM_H
#define LOCKSTEP_CUDA_NCCL_COMM_H

#include <cuda_runtime_api.h>

#include <array>
#include <string>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_buffer.h"

namespace lockstep {

constexpr size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<uint8_t, kNcclUniqueIdBytes>;

enum class ReduceDType { kInt32, kInt64, kFloat32, kFloat64 };
enum class ReduceOp { kSum, kMax, kMin };

// One rank of an NCCL group, bound to one device and stream. Every call is a
// collective: all ranks must make the same calls in the same order (the Go
// side's golden rule). Failures throw EngineError: ENG_COMM_ERROR naming the
// collective, ENG_TIMEOUT after a bounded wait expired (the communicator is
// then aborted), ENG_DEVICE_ERROR for CUDA failures. Calls block until the
// result is in host memory.
class NcclComm {
 public:
  // A fresh unique id (on the rank that bootstraps the group).
  static NcclUniqueIdBytes new_unique_id();

  // timeout_ms <= 0: wait without bound (tests of one rank).
  NcclComm(const NcclUniqueIdBytes& id, int rank, int world, int device, cudaStream_t stream,
           int timeout_ms = 0);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Collectives that returned before NCCL had issued them (ncclInProgress),
  // whose copy back therefore waited: how often the wait mattered (tests).
  int64_t late_issues() const { return late_issues_; }

  // Variable-size allgather: rank r contributes `bytes` bytes; on return
  // out holds every rank's bytes concatenated in rank order and sizes[r] its
  // length. (Two collectives: the sizes, then the payload padded to the max;
  // the payload collective runs even when every size is 0.) A rank passing
  // bytes_ok = false still joins the size exchange (as length -1) and then
  // every rank throws ENG_INVALID_ARGUMENT, so no peer is left waiting.
  void allgather(const void* in, size_t bytes, std::vector<uint8_t>* out, std::vector<uint64_t>* sizes,
                 bool bytes_ok = true);
  // Broadcast of `bytes` bytes from root into buf on every rank. Zero bytes
  // still run a (one-byte) collective: every rank issues the same sequence.
  void broadcast(void* buf, size_t bytes, int root);
  // Device-to-device all-to-all on the communicator's stream (expert
  // parallelism, moe_cuda.cu): sends the bytes [send_offs[d], send_offs[d +
  // 1]) of send to rank d and receives rank s's bytes into [recv_offs[s],
  // recv_offs[s + 1]) of recv, one grouped ncclSend/ncclRecv per peer with
  // bytes (this rank's own share is a device copy). Both offset vectors have
  // world + 1 entries; the peers' counts must pair (the caller agreed on them
  // beforehand). Returns once the exchange is on the stream (issued within
  // the timeout); `what` names it in every error ("MoE dispatch exchange at
  // layer 3"). Does not wait for completion: wait_done does.
  void alltoallv_device(const void* send, const std::vector<int64_t>& send_offs, void* recv,
                        const std::vector<int64_t>& recv_offs, const std::string& what);
  // In-place device allgather on the communicator's stream (Helix,
  // helix_cuda.cu): buf holds world blocks of `bytes` bytes; this rank's
  // block (rank * bytes) is sent, and every other rank's block arrives in
  // its place. Every rank passes the same `bytes` (the caller agreed on it
  // beforehand). Returns once the collective is on the stream; `what` names
  // it in every error. Does not wait for completion: wait_done does.
  void allgather_device(void* buf, size_t bytes, const std::string& what);
  // Waits within the timeout for the stream's queued work, the exchange
  // `what` included; aborts the communicator and throws ENG_TIMEOUT naming
  // it on expiry.
  void wait_done(const std::string& what) { wait(what.c_str()); }
  // In-place allreduce of count elements (count 0 still runs a one-element
  // collective on a zero).
  void allreduce(void* buf, size_t count, ReduceDType dtype, ReduceOp op);

 private:
  void stage(size_t bytes);
  // Polls ncclCommGetAsyncError until the communicator's last call (its
  // creation or a collective `what`) has been issued (ncclSuccess) within
  // the timeout; aborts the communicator and throws on expiry (hint is
  // appended to the message) or NCCL error. Returns whether it had to wait.
  bool wait_issued(const char* what, const char* hint);
  // wait_issued after a collective, counting late issues.
  void issued(const char* what);
  // Throws when an earlier failure aborted (and freed) the communicator: no
  // NCCL call may use it again.
  void usable(const char* what) const;
  // Waits for the stream's queued work (the collective `what`) within the
  // timeout; aborts the communicator and throws on expiry or NCCL error.
  void wait(const char* what);
  [[noreturn]] void abort_and_throw(int status, const std::string& msg);

  void* comm_ = nullptr;  // ncclComm_t (kept opaque so this header needs no nccl.h)
  int rank_, world_, device_, timeout_ms_;
  bool aborted_ = false;
  int64_t late_issues_ = 0;
  cudaStream_t stream_;
  DeviceBuffer send_, recv_;
  PinnedBuffer host_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_NCCL_COMM_H
