// moe_layout.cpp: see moe_layout.h.
#include "moe_layout.h"

#include <cstring>

#include "backend.h"

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

void plan_moe_dispatch(const MoeLayout& L, int32_t members, int32_t me, MoeEpPlan* p) {
  const int64_t R = L.rows;
  const int32_t K = L.top_k;
  p->members = members;
  p->me = me;
  p->send_offsets.assign(size_t(members) + 1, 0);
  for (int32_t e : L.expert) ++p->send_offsets[size_t(expert_owner(e, members)) + 1];
  for (int32_t d = 0; d < members; ++d) p->send_offsets[size_t(d) + 1] += p->send_offsets[size_t(d)];
  std::vector<int32_t> next(p->send_offsets.begin(), p->send_offsets.end() - 1);
  p->send_row.resize(size_t(R * K));
  p->send_pos.resize(size_t(R * K));
  p->send_experts.resize(size_t(members));
  for (int32_t d = 0; d < members; ++d)
    p->send_experts[size_t(d)].resize(sizeof(int32_t) *
                                      size_t(p->send_offsets[size_t(d) + 1] - p->send_offsets[size_t(d)]));
  for (int64_t r = 0; r < R; ++r)
    for (int32_t k = 0; k < K; ++k) {
      const int32_t e = L.expert[size_t(r * K + k)], d = expert_owner(e, members);
      const int32_t at = next[size_t(d)]++;
      p->send_row[size_t(at)] = int32_t(r);
      p->send_pos[size_t(r * K + k)] = at;
      std::memcpy(p->send_experts[size_t(d)].data() + sizeof(int32_t) * size_t(at - p->send_offsets[size_t(d)]), &e,
                  sizeof e);
    }
}

std::string plan_moe_receive(const std::vector<std::vector<char>>& recv, int32_t E, MoeEpPlan* p) {
  const int32_t P = p->members;
  if (int32_t(recv.size()) != P)
    return "expert ids from " + std::to_string(recv.size()) + " members, not " + std::to_string(P);
  p->recv_offsets.assign(size_t(P) + 1, 0);
  for (int32_t s = 0; s < P; ++s) {
    if (recv[size_t(s)].size() % sizeof(int32_t) != 0)
      return "member " + std::to_string(s) + " sent " + std::to_string(recv[size_t(s)].size()) +
             " bytes of expert ids, not a whole number of int32s";
    p->recv_offsets[size_t(s) + 1] = p->recv_offsets[size_t(s)] + int32_t(recv[size_t(s)].size() / sizeof(int32_t));
  }
  const int64_t n = p->received();
  std::vector<int32_t> expert(static_cast<size_t>(n));
  p->grouped_offsets.assign(size_t(E) + 1, 0);
  for (int32_t s = 0; s < P; ++s)
    for (int32_t j = p->recv_offsets[size_t(s)]; j < p->recv_offsets[size_t(s) + 1]; ++j) {
      int32_t e = -1;
      std::memcpy(&e, recv[size_t(s)].data() + sizeof(int32_t) * size_t(j - p->recv_offsets[size_t(s)]), sizeof e);
      if (e < 0 || e >= E || expert_owner(e, P) != p->me)
        return "member " + std::to_string(s) + " sent a token for expert " + std::to_string(e) + ", which member " +
               std::to_string(p->me) + " does not own";
      expert[size_t(j)] = e;
      ++p->grouped_offsets[size_t(e) + 1];
    }
  for (int32_t e = 0; e < E; ++e) p->grouped_offsets[size_t(e) + 1] += p->grouped_offsets[size_t(e)];
  // Records in (source, record) order are already that order within each
  // expert: a stable counting sort.
  std::vector<int32_t> next(p->grouped_offsets.begin(), p->grouped_offsets.end() - 1);
  p->grouped_src.resize(size_t(n));
  p->answer_slot.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) {
    const int32_t g = next[size_t(expert[size_t(j)])]++;
    p->grouped_src[size_t(g)] = int32_t(j);
    p->answer_slot[size_t(j)] = g;
  }
  return "";
}

void MoeEpPlan::pack(const MoeLayout& L, int32_t* out) const {
  const int64_t S = sent(), rk = L.rows * L.top_k, n = received();
  std::memcpy(out, send_row.data(), sizeof(int32_t) * size_t(S));
  std::memcpy(out + S, send_pos.data(), sizeof(int32_t) * size_t(rk));
  std::memcpy(out + S + rk, L.weight.data(), sizeof(float) * size_t(rk));
  std::memcpy(out + S + 2 * rk, grouped_src.data(), sizeof(int32_t) * size_t(n));
  std::memcpy(out + S + 2 * rk + n, answer_slot.data(), sizeof(int32_t) * size_t(n));
}

}  // namespace lockstep
