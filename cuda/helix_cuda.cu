// helix_cuda.cu: the CUDA backend's Helix context parallelism: the transport's choice, each
// member's attention partials, their exchange and merge (model_cuda.h).
#include "model_cuda.h"
#include "model_cuda_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attn_decode.cuh"
#include "kernels/attn_merge.cuh"

namespace lockstep {

using cuda_internal::at;

void CudaBackend::join_cp(int32_t size, int32_t rank) { cp_share_ = HelixShare{size, rank}; }

// The Helix transport, chosen at the first Helix step from what every
// member sends through the CP group: whether it was built with NCCL and its
// device's PCI bus id. NCCL when every member has it and a device of its own;
// otherwise the group's exchange through the host. Every member sees the same
// replies, so all choose alike. With NCCL, member 0's unique id then reaches
// the others the same way, and each opens a communicator on its device and
// stream.
void CudaBackend::open_helix() {
  if (helix_open_) return;
  constexpr size_t kBusId = 64;
  char mine[1 + kBusId] = {};
#ifdef ENGINE_HAVE_NCCL
  mine[0] = 1;
#endif
  CUDA_CHECK(cudaDeviceGetPCIBusId(mine + 1, int(kBusId) - 1, device_));
  const ExchangeTag boot{ExchangeKind::kHelixAttention, -1};
  std::vector<std::vector<char>> all;
  cp_->allgather(boot, mine, sizeof(mine), &all);
  bool nccl = all.size() == size_t(cp_share_.size);
  for (size_t i = 0; nccl && i < all.size(); ++i) {
    if (all[i].size() != sizeof(mine))
      throw EngineError(ENG_COMM_ERROR, "Helix bootstrap: member " + std::to_string(i) + " sent " +
                                            std::to_string(all[i].size()) + " bytes, not " +
                                            std::to_string(sizeof(mine)));
    nccl = all[i][0] == 1;
    for (size_t j = 0; nccl && j < i; ++j)
      nccl = std::strncmp(all[i].data() + 1, all[j].data() + 1, kBusId) != 0;
  }
#ifdef ENGINE_HAVE_NCCL
  if (nccl)
    cp_comm_ = cuda_internal::open_group_nccl(cp_, boot, device_, stream_, kHelixNcclTimeoutMs, "Helix");
#endif
  helix_nccl_ = nccl;
  helix_open_ = true;
}

// Helix attention of one layer (model_cuda.h): this member's partial of
// every (row, head) into its block of helix_parts_, then exchange_and_merge
// into attn_.
void CudaBackend::helix_attention(int32_t layer) {
  const int32_t D = shape_.head_dim, Hq = shape_.num_heads, Hkv = shape_.num_kv_heads;
  const int64_t R = desc_.rows, items = R * Hq;
  const int64_t block = items * (D + 1);  // floats per member: outputs, then LSEs
  float* parts = helix_parts_.as<float>();
  float* mine = parts + cp_share_.rank * block;
  AttnArgs a;
  a.q = qkv_.as<float>();
  a.q_stride = int64_t(Hq + 2 * Hkv) * D;
  a.kv = pages_->view(layer);
  a.block_tables = at<int32_t>(dev_desc_, desc_.off_blocks);
  const AttnSeq* entries = reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_hseqs));
  a.num_heads = Hq;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.o_part = mine;
  a.lse_part = mine + items * D;
  a.part_rows = int32_t(R);
  // One entry per row, in launches of at most 65 535 (the grid's z limit);
  // each entry names its own partial row.
  constexpr int64_t kMaxGridZ = 65535;
  for (int64_t r0 = 0; r0 < R; r0 += kMaxGridZ) {
    a.seqs = entries + r0;
    a.num_seqs = int32_t(std::min(kMaxGridZ, R - r0));
    attn_decode(a, stream_);
  }
  exchange_and_merge(layer, int32_t(D), attn_.as<__nv_bfloat16>());
}

// The members' partials of layer `layer` (each member's block of
// helix_parts_: rows * heads outputs of width `width`, then their LSEs; this
// member's block written), exchanged over the chosen transport, then merged
// in member order into out ([rows][heads][width], bf16).
void CudaBackend::exchange_and_merge(int32_t layer, int32_t width, __nv_bfloat16* out) {
  const int32_t heads = shape_.num_heads;
  const int64_t R = desc_.rows, items = R * heads;
  const int64_t block = items * (width + 1);
  float* parts = helix_parts_.as<float>();
  const float* mine = parts + cp_share_.rank * block;
  const ExchangeTag tag{ExchangeKind::kHelixAttention, layer};
  const size_t bytes = size_t(block) * sizeof(float);
  if (helix_nccl_) {
#ifdef ENGINE_HAVE_NCCL
    cp_comm_->allgather_device(parts, bytes, describe(tag));
#endif
  } else {
    // Through the host: this member's block out, every member's back in
    // (buffers sized by reserve_scratch).
    CUDA_CHECK(cudaMemcpyAsync(helix_host_.as<void>(), mine, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // also: the last layer's upload of helix_host_all_ is done
    cp_->allgather(tag, helix_host_.as<void>(), bytes, &helix_all_);
    char* dst = helix_host_all_.as<char>();
    for (size_t k = 0; k < helix_all_.size(); ++k) {
      if (helix_all_[k].size() != bytes)
        throw EngineError(ENG_COMM_ERROR, describe(tag) + ": member " + std::to_string(k) + " sent " +
                                              std::to_string(helix_all_[k].size()) + " bytes of partials, not " +
                                              std::to_string(bytes));
      std::memcpy(dst + k * bytes, helix_all_[k].data(), bytes);
    }
    CUDA_CHECK(cudaMemcpyAsync(parts, dst, bytes * size_t(cp_share_.size), cudaMemcpyHostToDevice, stream_));
  }
  MergeArgs m;
  m.o_part = parts;
  m.lse_part = parts + items * width;
  m.o_part_stride = m.lse_part_stride = block;
  m.num_parts = cp_share_.size;
  m.part_items = items;
  m.num_heads = heads;
  m.head_dim = width;
  m.out_bf16 = out;
  m.out_stride = int64_t(heads) * width;
  attn_merge(m, stream_);
}

}  // namespace lockstep
