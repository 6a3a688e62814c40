// nccl_comm.h: the engine-side NCCL communicator behind nccl.Comm
// (DESIGN.md §5) -- collectives of host byte buffers staged through device
// buffers owned here, on the engine's stream.
//
// Internal C++ API; the C ABI for it is a later issue. What engine.h will need
// (proposal, to be added with ENG_ABI_VERSION 2):
//   typedef struct eng_comm* eng_comm_t;
//   eng_status eng_comm_unique_id(uint8_t out[128]);          // rank 0 only
//   eng_status eng_comm_init(eng_engine_t eng, const uint8_t id[128], int32_t rank,
//                            int32_t world, eng_comm_t* out);   // device = the engine's
//   eng_status eng_comm_free(eng_comm_t c);
//   const char* eng_comm_last_error(eng_comm_t c);
//   eng_status eng_comm_allgather(eng_comm_t c, const void* in, uint64_t bytes,
//                                 void* out, uint64_t* out_sizes);   // variable size
//   eng_status eng_comm_broadcast(eng_comm_t c, void* buf, uint64_t bytes, int32_t root);
//   eng_status eng_comm_allreduce(eng_comm_t c, void* buf, uint64_t count,
//                                 int32_t dtype, int32_t op);
// The unique id (ncclUniqueId, 128 bytes) travels through the Go bootstrap
// (MPI broadcast or the TCP store) as plain bytes.
#ifndef LOCKSTEP_CUDA_NCCL_COMM_H
#define LOCKSTEP_CUDA_NCCL_COMM_H

#include <cuda_runtime_api.h>

#include <array>
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
// side's golden rule). Failures throw EngineError(ENG_COMM_ERROR) naming the
// collective, or ENG_DEVICE_ERROR for CUDA failures. Calls block until the
// result is in host memory.
class NcclComm {
 public:
  // A fresh unique id (on the rank that bootstraps the group).
  static NcclUniqueIdBytes new_unique_id();

  NcclComm(const NcclUniqueIdBytes& id, int rank, int world, int device, cudaStream_t stream);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Variable-size allgather: rank r contributes `bytes` bytes; on return
  // out holds every rank's bytes concatenated in rank order and sizes[r] its
  // length. (Two collectives: the sizes, then the payload padded to the max.)
  void allgather(const void* in, size_t bytes, std::vector<uint8_t>* out, std::vector<uint64_t>* sizes);
  // Broadcast of `bytes` bytes from root into buf on every rank.
  void broadcast(void* buf, size_t bytes, int root);
  // In-place allreduce of count elements.
  void allreduce(void* buf, size_t count, ReduceDType dtype, ReduceOp op);

 private:
  void stage(size_t bytes);

  void* comm_ = nullptr;  // ncclComm_t (kept opaque so this header needs no nccl.h)
  int rank_, world_, device_;
  cudaStream_t stream_;
  DeviceBuffer send_, recv_;
  PinnedBuffer host_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_NCCL_COMM_H
