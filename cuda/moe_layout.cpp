// moe_layout.cpp: see moe_layout.h.
#include "moe_layout.h"

#include <cstring>

#include "model_cpu.h"

namespace lockstep {

void MoeLayout::pack(int32_t* out) const {
  const int64_t n = total(), rk = rows * top_k;
  std::memcpy(out, src_row.data(), sizeof(int32_t) * size_t(n));
  std::memcpy(out + n, slot_of.data(), sizeof(int32_t) * size_t(rk));
  std::memcpy(out + n + rk, weight.data(), sizeof(float) * size_t(rk));
}

void build_moe_layout(const eng_model_shape& s, const float* logits, int64_t rows, const float* router_bias,
                      MoeLayout* out) {
  const int32_t E = s.num_experts, K = s.num_experts_per_tok;
  out->rows = rows;
  out->experts = E;
  out->top_k = K;
  out->expert.resize(size_t(rows * K));
  out->weight.resize(size_t(rows * K));
  RouteParams rp;
  rp.E = E;
  rp.K = K;
  rp.norm = s.router_norm;
  rp.bias = router_bias;
  rp.scaling = s.routed_scaling_factor == 0 ? 1.0 : double(s.routed_scaling_factor);
  rp.groups = s.expert_groups;
  rp.groups_used = s.expert_groups_used;
  std::vector<char> taken;
  for (int64_t r = 0; r < rows; ++r)
    moe_route_row(logits + r * E, rp, out->expert.data() + r * K, out->weight.data() + r * K, taken);
  // Counting sort of the (row, k) pairs by expert, rows ascending within one.
  out->offsets.assign(size_t(E) + 1, 0);
  for (int32_t e : out->expert) ++out->offsets[size_t(e) + 1];
  for (int32_t e = 0; e < E; ++e) out->offsets[size_t(e) + 1] += out->offsets[size_t(e)];
  std::vector<int32_t> next(out->offsets.begin(), out->offsets.end() - 1);
  out->src_row.resize(size_t(rows * K));
  out->slot_of.resize(size_t(rows * K));
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t k = 0; k < K; ++k) {
      const int32_t slot = next[size_t(out->expert[size_t(r * K + k)])]++;
      out->src_row[size_t(slot)] = int32_t(r);
      out->slot_of[size_t(r * K + k)] = slot;
    }
}

}  // namespace lockstep
