// nccl_comm.cu: see nccl_comm.h.
#include "nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "comm_nccl.h"
#include "cuda_check.h"

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    const ncclResult_t lockstep_nr_ = (call);                                              \
    if (lockstep_nr_ != ncclSuccess && lockstep_nr_ != ncclInProgress)                     \
      throw ::lockstep::EngineError(ENG_COMM_ERROR,                                        \
                                    std::string("NCCL error at " __FILE__ ":") +           \
                                        std::to_string(__LINE__) + ": " + #call + ": " +   \
                                        ncclGetErrorString(lockstep_nr_));                 \
  } while (0)

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

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
                   cudaStream_t stream, int timeout_ms)
    : rank_(rank), world_(world), device_(device), timeout_ms_(timeout_ms), stream_(stream) {
  if (world <= 0 || rank < 0 || rank >= world)
    throw EngineError(ENG_INVALID_ARGUMENT, "NCCL: rank " + std::to_string(rank) +
                                                " is not in [0, world = " + std::to_string(world) + ")");
  CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // creation and collectives return at once; wait() bounds the wait
  ncclComm_t c = nullptr;
  NCCL_CHECK(ncclCommInitRankConfig(&c, world, id, rank, &config));
  comm_ = c;
  // Creation completes asynchronously (it needs every rank).
  wait_issued("group creation", " (a rank missing?)");
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr || aborted_) return;  // an aborted communicator is already freed
  cudaSetDevice(device_);
  // Non-blocking communicator: finalize (flushes outstanding work, in
  // progress asynchronously), then destroy; if that does not complete in
  // time, abort.
  ncclResult_t st = ncclCommFinalize(as_comm(comm_));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_ > 0 ? timeout_ms_ : 10000);
  while ((st == ncclSuccess || st == ncclInProgress) && Clock::now() < deadline) {
    if (ncclCommGetAsyncError(as_comm(comm_), &st) != ncclSuccess) break;
    if (st == ncclSuccess) {
      ncclCommDestroy(as_comm(comm_));
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ncclCommAbort(as_comm(comm_));
}

void NcclComm::abort_and_throw(int status, const std::string& msg) {
  if (comm_ != nullptr && !aborted_) {
    ncclCommAbort(as_comm(comm_));
    aborted_ = true;
  }
  throw EngineError(static_cast<eng_status>(status), msg);
}

bool NcclComm::wait_issued(const char* what, const char* hint) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  bool waited = false;
  for (;;) {
    ncclResult_t st = ncclInProgress;
    NCCL_CHECK(ncclCommGetAsyncError(as_comm(comm_), &st));
    if (st == ncclSuccess) return waited;
    const std::string where = " (rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ")";
    if (st != ncclInProgress) abort_and_throw(ENG_COMM_ERROR, std::string("NCCL ") + what + where + " failed: " +
                                                                  ncclGetErrorString(st));
    if (timeout_ms_ > 0 && Clock::now() > deadline)
      abort_and_throw(ENG_TIMEOUT, std::string("NCCL ") + what + where + " was still in progress after " +
                                       std::to_string(timeout_ms_) + " ms" + hint + ": communicator aborted");
    waited = true;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::issued(const char* what) {
  if (wait_issued(what, "")) ++late_issues_;
}

void NcclComm::usable(const char* what) const {
  if (aborted_)
    throw EngineError(ENG_COMM_ERROR,
                      std::string("NCCL ") + what + ": the communicator was aborted by an earlier failure");
}

void NcclComm::wait(const char* what) {
  usable(what);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t st = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(as_comm(comm_), &st));
    if (st != ncclSuccess && st != ncclInProgress)
      abort_and_throw(ENG_COMM_ERROR, std::string("NCCL ") + what + " failed on rank " + std::to_string(rank_) +
                                          ": " + ncclGetErrorString(st));
    if (timeout_ms_ > 0 && Clock::now() > deadline)
      abort_and_throw(ENG_TIMEOUT, std::string("NCCL ") + what + " did not complete within " +
                                       std::to_string(timeout_ms_) + " ms on rank " + std::to_string(rank_) +
                                       " of " + std::to_string(world_) + ": communicator aborted");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::alltoallv_device(const void* send, const std::vector<int64_t>& send_offs, void* recv,
                                const std::vector<int64_t>& recv_offs, const std::string& what) {
  usable(what.c_str());
  if (send_offs.size() != size_t(world_) + 1 || recv_offs.size() != size_t(world_) + 1)
    throw EngineError(ENG_INTERNAL, "NCCL " + what + ": offsets for " + std::to_string(send_offs.size()) + " / " +
                                        std::to_string(recv_offs.size()) + " ranks in a group of " +
                                        std::to_string(world_));
  CUDA_CHECK(cudaSetDevice(device_));
  const char* sp = static_cast<const char*>(send);
  char* rp = static_cast<char*>(recv);
  NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    const int64_t sn = send_offs[size_t(peer) + 1] - send_offs[size_t(peer)];
    const int64_t rn = recv_offs[size_t(peer) + 1] - recv_offs[size_t(peer)];
    if (sn > 0) NCCL_CHECK(ncclSend(sp + send_offs[size_t(peer)], size_t(sn), ncclUint8, peer, as_comm(comm_), stream_));
    if (rn > 0) NCCL_CHECK(ncclRecv(rp + recv_offs[size_t(peer)], size_t(rn), ncclUint8, peer, as_comm(comm_), stream_));
  }
  NCCL_CHECK(ncclGroupEnd());
  issued(what.c_str());
  const int64_t own = send_offs[size_t(rank_) + 1] - send_offs[size_t(rank_)];
  if (own != recv_offs[size_t(rank_) + 1] - recv_offs[size_t(rank_)])
    throw EngineError(ENG_INTERNAL, "NCCL " + what + ": this rank sends itself " + std::to_string(own) +
                                        " bytes but expects " +
                                        std::to_string(recv_offs[size_t(rank_) + 1] - recv_offs[size_t(rank_)]));
  if (own > 0)
    CUDA_CHECK(cudaMemcpyAsync(rp + recv_offs[size_t(rank_)], sp + send_offs[size_t(rank_)], size_t(own),
                               cudaMemcpyDeviceToDevice, stream_));
}

void NcclComm::allgather_device(void* buf, size_t bytes, const std::string& what) {
  usable(what.c_str());
  CUDA_CHECK(cudaSetDevice(device_));
  char* p = static_cast<char*>(buf);
  // In place: the send buffer is this rank's block of the receive buffer.
  NCCL_CHECK(ncclAllGather(p + size_t(rank_) * bytes, p, bytes, ncclUint8, as_comm(comm_), stream_));
  issued(what.c_str());
}

void NcclComm::stage(size_t bytes) {
  send_.reserve(std::max<size_t>(bytes, 16));
  recv_.reserve(std::max<size_t>(bytes * size_t(world_), 16));
  host_.reserve(std::max<size_t>(bytes * size_t(world_), 16));
}

void NcclComm::allgather(const void* in, size_t bytes, std::vector<uint8_t>* out, std::vector<uint64_t>* sizes,
                         bool bytes_ok) {
  usable("allgather");
  CUDA_CHECK(cudaSetDevice(device_));
  // 1. Every rank's size (-1: this rank's arguments were invalid).
  stage(sizeof(int64_t));
  int64_t* h = host_.as<int64_t>();
  h[0] = bytes_ok ? int64_t(bytes) : -1;
  CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), h, sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllGather(send_.as<void>(), recv_.as<void>(), 1, ncclInt64, as_comm(comm_), stream_));
  issued("allgather (sizes)");
  CUDA_CHECK(cudaMemcpyAsync(h, recv_.as<void>(), sizeof(int64_t) * size_t(world_), cudaMemcpyDeviceToHost,
                             stream_));
  wait("allgather (sizes)");
  std::vector<int64_t> lens(h, h + world_);
  for (int r = 0; r < world_; ++r)
    if (lens[size_t(r)] < 0)
      throw EngineError(ENG_INVALID_ARGUMENT, "NCCL allgather: rank " + std::to_string(r) +
                                                  " passed invalid arguments (negative length or NULL buffers)");
  sizes->assign(lens.begin(), lens.end());
  // 2. The payload, every contribution padded to the largest (at least one
  // byte, so that every rank runs this collective even when all are empty).
  const size_t max_bytes = std::max<size_t>(1, size_t(*std::max_element(lens.begin(), lens.end())));
  stage(max_bytes);
  if (bytes > 0) {
    std::memcpy(host_.as<void>(), in, bytes);  // pinned staging: the copy is truly asynchronous
    CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), host_.as<void>(), bytes, cudaMemcpyHostToDevice, stream_));
  }
  NCCL_CHECK(ncclAllGather(send_.as<void>(), recv_.as<void>(), max_bytes, ncclUint8, as_comm(comm_), stream_));
  issued("allgather (payload)");
  CUDA_CHECK(cudaMemcpyAsync(host_.as<void>(), recv_.as<void>(), max_bytes * size_t(world_),
                             cudaMemcpyDeviceToHost, stream_));
  wait("allgather (payload)");
  out->clear();
  for (int r = 0; r < world_; ++r) {
    const uint8_t* p = host_.as<uint8_t>() + size_t(r) * max_bytes;
    out->insert(out->end(), p, p + (*sizes)[size_t(r)]);
  }
}

void NcclComm::broadcast(void* buf, size_t bytes, int root) {
  usable("broadcast");
  CUDA_CHECK(cudaSetDevice(device_));
  // Zero bytes still run the collective (one padding byte): skipping it on
  // some ranks would desynchronise the NCCL call sequence.
  const size_t n = std::max<size_t>(bytes, 1);
  stage(n);
  if (rank_ == root) {
    std::memset(host_.as<void>(), 0, n);
    if (bytes > 0) std::memcpy(host_.as<void>(), buf, bytes);
    CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), host_.as<void>(), n, cudaMemcpyHostToDevice, stream_));
  }
  NCCL_CHECK(ncclBroadcast(send_.as<void>(), send_.as<void>(), n, ncclUint8, root, as_comm(comm_), stream_));
  issued("broadcast");
  CUDA_CHECK(cudaMemcpyAsync(host_.as<void>(), send_.as<void>(), n, cudaMemcpyDeviceToHost, stream_));
  wait("broadcast");
  if (bytes > 0) std::memcpy(buf, host_.as<void>(), bytes);
}

void NcclComm::allreduce(void* buf, size_t count, ReduceDType dtype, ReduceOp op) {
  usable("allreduce");
  CUDA_CHECK(cudaSetDevice(device_));
  const size_t n = std::max<size_t>(count, 1);  // count 0: one zero element (see broadcast)
  const size_t bytes = count * type_size(dtype), staged = n * type_size(dtype);
  stage(staged);
  std::memset(host_.as<void>(), 0, staged);
  if (bytes > 0) std::memcpy(host_.as<void>(), buf, bytes);
  CUDA_CHECK(cudaMemcpyAsync(send_.as<void>(), host_.as<void>(), staged, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllReduce(send_.as<void>(), send_.as<void>(), n, nccl_type(dtype), nccl_op(op), as_comm(comm_),
                           stream_));
  issued("allreduce");
  CUDA_CHECK(cudaMemcpyAsync(host_.as<void>(), send_.as<void>(), staged, cudaMemcpyDeviceToHost, stream_));
  wait("allreduce");
  if (bytes > 0) std::memcpy(buf, host_.as<void>(), bytes);
}

// --- The eng_comm_* Communicator over NCCL (comm_nccl.h). ---
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const uint8_t* id, int32_t rank, int32_t size, int32_t device, int32_t timeout_ms) {
    CUDA_CHECK(cudaSetDevice(device));
    stream_ = std::make_unique<CudaStream>();  // on `device`
    NcclUniqueIdBytes idb;
    std::memcpy(idb.data(), id, idb.size());
    comm_ = std::make_unique<NcclComm>(idb, rank, size, device, stream_->get(), timeout_ms);
  }
  int32_t rank() const override { return comm_->rank(); }
  int32_t size() const override { return comm_->world(); }
  const uint8_t* allgatherv(const void* send, int64_t send_len, bool send_ok, int64_t* recv_lens) override {
    comm_->allgather(send, send_ok ? size_t(send_len) : 0, &recv_, &sizes_, send_ok);
    for (size_t r = 0; r < sizes_.size(); ++r) recv_lens[r] = int64_t(sizes_[r]);
    return recv_.data();
  }
  void abort(int32_t code) override {
    throw EngineError(ENG_UNSUPPORTED, "eng_comm_abort: an NCCL communicator cannot terminate the job (code " +
                                           std::to_string(code) + "); exit the process instead");
  }

 private:
  std::unique_ptr<CudaStream> stream_;  // declared before comm_: destroyed after it
  std::unique_ptr<NcclComm> comm_;
  std::vector<uint8_t> recv_;
  std::vector<uint64_t> sizes_;
};

}  // namespace

void nccl_unique_id(uint8_t out[kNcclIdBytes]) {
  const NcclUniqueIdBytes id = NcclComm::new_unique_id();
  std::memcpy(out, id.data(), id.size());
}

std::unique_ptr<Communicator> open_nccl_comm(const uint8_t id[kNcclIdBytes], int32_t rank, int32_t size,
                                             int32_t device, int32_t timeout_ms) {
  if (timeout_ms <= 0)
    throw EngineError(ENG_INVALID_ARGUMENT, "eng_comm_init_nccl: timeout_ms must be > 0 (every wait is bounded), got " +
                                                std::to_string(timeout_ms));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    throw EngineError(ENG_INVALID_ARGUMENT, "eng_comm_init_nccl: device " + std::to_string(device) + " but " +
                                                std::to_string(count) + " CUDA devices are visible");
  }
  return std::make_unique<NcclCommunicator>(id, rank, size, device, timeout_ms);
}

}  // namespace lockstep
