// test_moe_layout: the CUDA engine's host-side MoE layout (cuda/moe_layout.h),
// checked on the CPU (no CUDA needed; it runs in `make test`). For the
// moe-tiny and deepseek-tiny router rules (softmax/top-k/renormalise;
// sigmoid with a bias, groups and scaling), random logits of 1, 7 and 300
// rows:
//   1. each row's experts and weights are moe_route_row's (the CPU engine's
//      routing, bit for bit);
//   2. the slots are a permutation of the (row, k) pairs, grouped by expert
//      in ascending id, rows ascending within an expert, with offsets that
//      bound each expert's slots;
//   3. the device's gather, per-expert compute and combine, replayed on the
//      host through the packed block, give every row sum_k w_k * f_e(row)
//      in ascending expert order, the CPU engine's combine;
// and the checker fails on planted bugs (a swapped slot, an off-by-one
// offset).
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "model_cpu.h"
#include "moe_layout.h"
#include "presets.h"

using namespace lockstep;

namespace {

// The answer expert e gives for row r (a stand-in for its SwiGLU).
float answer(int32_t e, int32_t r) { return float(e) * 1000.0f + float(r) + 0.25f; }

// Everything the device does with a layout, on the host; "" when it holds.
std::string check_layout(const eng_model_shape& s, const std::vector<float>& logits, const std::vector<float>& bias,
                         const MoeLayout& L) {
  const int64_t R = L.rows;
  const int32_t E = s.num_experts, K = s.num_experts_per_tok;
  RouteParams rp;
  rp.E = E;
  rp.K = K;
  rp.norm = s.router_norm;
  rp.bias = bias.empty() ? nullptr : bias.data();
  rp.scaling = s.routed_scaling_factor == 0 ? 1.0 : double(s.routed_scaling_factor);
  rp.groups = s.expert_groups;
  rp.groups_used = s.expert_groups_used;
  std::vector<char> taken;
  std::vector<int32_t> ex(static_cast<size_t>(K));
  std::vector<float> wt(static_cast<size_t>(K));
  for (int64_t r = 0; r < R; ++r) {
    moe_route_row(logits.data() + r * E, rp, ex.data(), wt.data(), taken);
    for (int32_t k = 0; k < K; ++k)
      if (L.expert[size_t(r * K + k)] != ex[size_t(k)] ||
          std::memcmp(&L.weight[size_t(r * K + k)], &wt[size_t(k)], sizeof(float)) != 0)
        return "row " + std::to_string(r) + ": routing differs from moe_route_row";
  }
  if (L.offsets.size() != size_t(E) + 1 || L.offsets[0] != 0 || L.total() != R * K)
    return "offsets do not cover the rows * K slots";
  std::vector<int> seen(size_t(R * K), 0);
  for (int32_t e = 0; e < E; ++e) {
    if (L.offsets[size_t(e) + 1] < L.offsets[size_t(e)]) return "offsets decrease";
    for (int32_t sl = L.offsets[size_t(e)]; sl < L.offsets[size_t(e) + 1]; ++sl) {
      const int32_t r = L.src_row[size_t(sl)];
      if (r < 0 || r >= R) return "src_row out of range";
      if (sl > L.offsets[size_t(e)] && L.src_row[size_t(sl) - 1] >= r) return "rows not ascending within an expert";
      int32_t k = 0;
      while (k < K && L.expert[size_t(r * K + k)] != e) ++k;
      if (k == K) return "slot " + std::to_string(sl) + " holds a row that did not choose expert " + std::to_string(e);
      if (L.slot_of[size_t(r * K + k)] != sl) return "slot_of does not point back at slot " + std::to_string(sl);
      ++seen[size_t(r * K + k)];
    }
  }
  for (int v : seen)
    if (v != 1) return "a (row, k) pair has no slot or two";
  // The device's view: the packed block.
  std::vector<int32_t> block(size_t(L.device_words()));
  L.pack(block.data());
  const int32_t* src = block.data();
  const int32_t* slot_of = src + L.total();
  const float* w = reinterpret_cast<const float*>(slot_of + R * K);
  std::vector<float> y(size_t(L.total()));  // gather + expert compute
  for (int32_t e = 0; e < E; ++e)
    for (int32_t sl = L.offsets[size_t(e)]; sl < L.offsets[size_t(e) + 1]; ++sl) y[size_t(sl)] = answer(e, src[sl]);
  for (int64_t r = 0; r < R; ++r) {  // combine, ascending expert id
    float got = 0.0f;
    for (int32_t k = 0; k < K; ++k) got += w[r * K + k] * y[size_t(slot_of[r * K + k])];
    moe_route_row(logits.data() + r * E, rp, ex.data(), wt.data(), taken);
    float want = 0.0f;
    for (int32_t k = 0; k < K; ++k) want += wt[size_t(k)] * answer(ex[size_t(k)], int32_t(r));
    if (std::memcmp(&got, &want, sizeof got) != 0) return "row " + std::to_string(r) + ": the combine differs";
  }
  return "";
}

}  // namespace

int main() {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (const char* preset : {"moe-tiny", "deepseek-tiny"}) {
    eng_model_shape s;
    REQUIRE(find_preset(preset, &s));
    const int32_t E = s.num_experts;
    std::vector<float> bias;
    if (s.router_norm == ENG_ROUTER_SIGMOID_TOPK)
      for (int32_t e = 0; e < E; ++e) bias.push_back(0.1f * normal(rng));
    for (int64_t rows : {1, 7, 300}) {
      std::vector<float> logits(size_t(rows * E));
      for (float& x : logits) x = normal(rng);
      MoeLayout L;
      build_moe_layout(s, logits.data(), rows, bias.empty() ? nullptr : bias.data(), &L);
      const std::string why = check_layout(s, logits, bias, L);
      CHECKF(why.empty(), "%s, %lld rows: %s", preset, static_cast<long long>(rows), why.c_str());
      if (rows == 300) {
        // Planted bugs must be caught.
        MoeLayout bad = L;
        std::swap(bad.src_row[3], bad.src_row[200]);
        CHECKF(!check_layout(s, logits, bias, bad).empty(), "%s: a swapped slot went unnoticed", preset);
        bad = L;
        ++bad.offsets[size_t(E / 2)];
        CHECKF(!check_layout(s, logits, bias, bad).empty(), "%s: an off-by-one offset went unnoticed", preset);
      }
    }
  }
  return check_exit_code("test_moe_layout");
}
