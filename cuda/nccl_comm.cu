// nccl_comm.cu: see nccl_comm.h.
#include "nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_check.h"

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    const ncclResult_t lockstep_nr_ = (call);                                              \
    if (lockstep_nr_ != ncclSuccess)                                                       \
      throw ::lockstep::EngineError(ENG_COMM_ERROR,                                        \
                                    std::string("NCCL error at " __FILE__ ":") +           \
                                        std::to_string(__LINE__) + ": " + #call + ": " +   \
                                        ncclGetErrorString(lockstep_nr_));                 \
  } while (0)

namespace lockstep {
namespace {

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }

ncclDataType_t nccl_type(ReduceDType t) {
  switch (t) {
    case ReduceDType::kInt32: return ncclInt32;
    case ReduceDType::kInt64: return ncclInt64;
    case ReduceDType::kFloat32: return ncclFloat32;
    case ReduceDType::kFloat64: return ncclFloat64;
  }
  return ncclInt8;
}

size_t type_size(ReduceDType t) {
  return t == ReduceDType::kInt32 || t == ReduceDType::kFloat32 ? 4 : 8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

}  // namespace

NcclUniqueIdBytes NcclComm::new_unique_id() {
  static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId size changed");
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  NcclUniqueIdBytes out;
  std::memcpy(out.data(), &id, out.size());
  return out;
}

NcclComm::NcclComm(const NcclUniqueIdBytes& id_bytes, int rank, int world, int device,
                   cudaStream_t stream)
    : rank_(rank), world_(world), device_(device), stream_(stream) {
  if (world <= 0 || rank < 0 || rank >= world)
    throw EngineError(ENG_INVALID_ARGUMENT, "NCCL: rank " + std::to_string(rank) +
                                                " is not in [0, world = " + std::to_string(world) + ")");
  CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclComm_t c = nullptr;
  NCCL_CHECK(ncclCommInitRank(&c, world, id, rank));
  comm_ = c;
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(as_comm(comm_));
}

void NcclComm::stage(size_t bytes) {
  send_.reserve(std::max<size_t>(bytes, 16));
  recv_.reserve(std::max<size_t>(bytes * size_t(world_), 16));
  host_.reserve(std::max<size_t>(bytes * size_t(world_), 16));
}

void NcclComm::allgather(const void* in, size_t bytes, std::vector<uint8_t>* out,
                         std::vector<uint64_t>* sizes) {
  CUDA_CHECK(cudaSetDevice(device_));
  // 1. Every rank's size.
  stage(sizeof(uint64_t));
  const uint64_t mine = bytes;
  CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), &mine, sizeof mine, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllGather(send_.as<void>(), recv_.as<void>(), 1, ncclUint64, as_comm(comm_), stream_));
  sizes->resize(size_t(world_));
  CUDA_CHECK(cudaMemcpyAsync(sizes->data(), recv_.as<void>(), sizeof(uint64_t) * size_t(world_),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  const uint64_t max_bytes = *std::max_element(sizes->begin(), sizes->end());
  // 2. The payload, every contribution padded to the largest.
  stage(max_bytes);
  if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), in, bytes, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllGather(send_.as<void>(), recv_.as<void>(), max_bytes, ncclUint8, as_comm(comm_), stream_));
  CUDA_CHECK(cudaMemcpyAsync(host_.as<void>(), recv_.as<void>(), max_bytes * size_t(world_),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  out->clear();
  for (int r = 0; r < world_; ++r) {
    const uint8_t* p = host_.as<uint8_t>() + size_t(r) * max_bytes;
    out->insert(out->end(), p, p + (*sizes)[size_t(r)]);
  }
}

void NcclComm::broadcast(void* buf, size_t bytes, int root) {
  CUDA_CHECK(cudaSetDevice(device_));
  if (bytes == 0) return;
  stage(bytes);
  if (rank_ == root) CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), buf, bytes, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclBroadcast(send_.as<void>(), send_.as<void>(), bytes, ncclUint8, root, as_comm(comm_), stream_));
  CUDA_CHECK(cudaMemcpyAsync(buf, send_.as<void>(), bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void NcclComm::allreduce(void* buf, size_t count, ReduceDType dtype, ReduceOp op) {
  CUDA_CHECK(cudaSetDevice(device_));
  const size_t bytes = count * type_size(dtype);
  if (bytes == 0) return;
  stage(bytes);
  CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), buf, bytes, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllReduce(send_.as<void>(), send_.as<void>(), count, nccl_type(dtype), nccl_op(op),
                           as_comm(comm_), stream_));
  CUDA_CHECK(cudaMemcpyAsync(buf, send_.as<void>(), bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace lockstep
