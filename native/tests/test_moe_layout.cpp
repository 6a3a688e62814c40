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
// offset). Then expert parallelism (MoeEpPlan) over 2, 3 and 4 members with
// uneven rows (one member with none): every member's plans, the expert-id
// exchange and the two row exchanges replayed on the host through the packed
// blocks give each member's rows the sums one engine gives them, bit for bit;
// the grouped order is the CPU engine's; plan_moe_receive refuses an expert
// the member does not own, and a swapped answer slot is caught.
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

// The one-engine combine of member rows: sum_k w_k * answer(e_k, global row).
float want_row(const MoeLayout& L, int64_t r, int32_t global_row) {
  float want = 0.0f;
  for (int32_t k = 0; k < L.top_k; ++k)
    want += L.weight[size_t(r * L.top_k + k)] * answer(L.expert[size_t(r * L.top_k + k)], global_row);
  return want;
}

// Expert parallelism over `members` members whose layouts are Ls (member m's
// rows are global rows first[m] ..): "" when every member's combine equals
// one engine's. swap_answer plants a bug in member 0's answer slots.
std::string check_ep(const std::vector<MoeLayout>& Ls, const std::vector<int32_t>& first, bool swap_answer) {
  const int32_t P = int32_t(Ls.size()), E = Ls[0].experts;
  std::vector<MoeEpPlan> plans(static_cast<size_t>(P));
  for (int32_t m = 0; m < P; ++m) plan_moe_dispatch(Ls[size_t(m)], P, m, &plans[size_t(m)]);
  // The host exchange of expert ids (alltoallv: member m receives send_experts[m] of every s).
  for (int32_t m = 0; m < P; ++m) {
    std::vector<std::vector<char>> recv(static_cast<size_t>(P));
    for (int32_t s = 0; s < P; ++s) recv[size_t(s)] = plans[size_t(s)].send_experts[size_t(m)];
    const std::string why = plan_moe_receive(recv, E, &plans[size_t(m)]);
    if (!why.empty()) return "member " + std::to_string(m) + ": " + why;
    // The CPU engine's by_expert order: (source, record) within an expert.
    const MoeEpPlan& p = plans[size_t(m)];
    for (int32_t e = 0; e < E; ++e)
      for (int32_t g = p.grouped_offsets[size_t(e)] + 1; g < p.grouped_offsets[size_t(e) + 1]; ++g)
        if (p.grouped_src[size_t(g)] <= p.grouped_src[size_t(g) - 1]) return "grouped records out of order";
  }
  if (swap_answer && plans[0].received() >= 2) std::swap(plans[0].answer_slot[0], plans[0].answer_slot[1]);
  // What each member's device does, from its packed block. The rows a
  // record carries are its global row (x[r] = the row id): enough to check
  // every copy lands where it should.
  std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(P));
  for (int32_t m = 0; m < P; ++m) {
    blocks[size_t(m)].resize(size_t(plans[size_t(m)].device_words(Ls[size_t(m)])));
    plans[size_t(m)].pack(Ls[size_t(m)], blocks[size_t(m)].data());
  }
  auto send_row = [&](int32_t m) { return blocks[size_t(m)].data(); };
  auto send_pos = [&](int32_t m) { return blocks[size_t(m)].data() + plans[size_t(m)].sent(); };
  auto weight = [&](int32_t m) {
    return reinterpret_cast<const float*>(send_pos(m) + Ls[size_t(m)].rows * Ls[size_t(m)].top_k);
  };
  auto grouped_src = [&](int32_t m) {
    return reinterpret_cast<const int32_t*>(weight(m) + Ls[size_t(m)].rows * Ls[size_t(m)].top_k);
  };
  auto answer_slot = [&](int32_t m) { return grouped_src(m) + plans[size_t(m)].received(); };
  // Dispatch: pack by destination (moe_gather), NCCL send/recv per pair.
  std::vector<std::vector<int32_t>> sendbuf(static_cast<size_t>(P)), recvbuf(static_cast<size_t>(P));
  for (int32_t m = 0; m < P; ++m)
    for (int64_t i = 0; i < plans[size_t(m)].sent(); ++i) sendbuf[size_t(m)].push_back(first[size_t(m)] + send_row(m)[i]);
  for (int32_t m = 0; m < P; ++m) {
    recvbuf[size_t(m)].resize(size_t(plans[size_t(m)].received()));
    for (int32_t s = 0; s < P; ++s) {
      const int32_t cnt = plans[size_t(s)].send_offsets[size_t(m) + 1] - plans[size_t(s)].send_offsets[size_t(m)];
      if (cnt != plans[size_t(m)].recv_offsets[size_t(s) + 1] - plans[size_t(m)].recv_offsets[size_t(s)])
        return "member " + std::to_string(m) + " expects a different count from " + std::to_string(s);
      for (int32_t j = 0; j < cnt; ++j)
        recvbuf[size_t(m)][size_t(plans[size_t(m)].recv_offsets[size_t(s)] + j)] =
            sendbuf[size_t(s)][size_t(plans[size_t(s)].send_offsets[size_t(m)] + j)];
    }
  }
  // Experts over the grouped rows, answers back in record order.
  std::vector<std::vector<float>> yrec(static_cast<size_t>(P)), ycomb(static_cast<size_t>(P));
  for (int32_t m = 0; m < P; ++m) {
    const MoeEpPlan& p = plans[size_t(m)];
    std::vector<float> yg(size_t(p.received()));
    for (int32_t e = 0; e < E; ++e)
      for (int32_t g = p.grouped_offsets[size_t(e)]; g < p.grouped_offsets[size_t(e) + 1]; ++g)
        yg[size_t(g)] = answer(e, recvbuf[size_t(m)][size_t(grouped_src(m)[g])]);
    yrec[size_t(m)].resize(size_t(p.received()));
    for (int64_t j = 0; j < p.received(); ++j) yrec[size_t(m)][size_t(j)] = yg[size_t(answer_slot(m)[j])];
  }
  // Combine exchange: member m's answers to s go back into s's buffer where s sent them.
  for (int32_t s = 0; s < P; ++s) {
    ycomb[size_t(s)].resize(size_t(plans[size_t(s)].sent()));
    for (int32_t m = 0; m < P; ++m) {
      const int32_t cnt = plans[size_t(m)].recv_offsets[size_t(s) + 1] - plans[size_t(m)].recv_offsets[size_t(s)];
      for (int32_t j = 0; j < cnt; ++j)
        ycomb[size_t(s)][size_t(plans[size_t(s)].send_offsets[size_t(m)] + j)] =
            yrec[size_t(m)][size_t(plans[size_t(m)].recv_offsets[size_t(s)] + j)];
    }
  }
  // moe_combine with slot_of = send_pos.
  for (int32_t m = 0; m < P; ++m) {
    const MoeLayout& L = Ls[size_t(m)];
    for (int64_t r = 0; r < L.rows; ++r) {
      float got = 0.0f;
      for (int32_t k = 0; k < L.top_k; ++k)
        got += weight(m)[r * L.top_k + k] * ycomb[size_t(m)][size_t(send_pos(m)[r * L.top_k + k])];
      const float want = want_row(L, r, first[size_t(m)] + int32_t(r));
      if (std::memcmp(&got, &want, sizeof got) != 0)
        return "member " + std::to_string(m) + " row " + std::to_string(r) + ": the combine differs from one engine's";
    }
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
    // Expert parallelism.
    for (int32_t P : {2, 3, 4}) {
      std::vector<MoeLayout> Ls(static_cast<size_t>(P));
      std::vector<int32_t> first(static_cast<size_t>(P));
      int32_t next = 0;
      for (int32_t m = 0; m < P; ++m) {
        const int64_t rows = m == 1 ? 0 : 5 + 37 * m;  // member 1 runs an empty step
        std::vector<float> logits(size_t(rows * E));
        for (float& x : logits) x = normal(rng);
        build_moe_layout(s, logits.data(), rows, bias.empty() ? nullptr : bias.data(), &Ls[size_t(m)]);
        first[size_t(m)] = next;
        next += int32_t(rows);
      }
      const std::string why = check_ep(Ls, first, false);
      CHECKF(why.empty(), "%s, EP %d: %s", preset, P, why.c_str());
      CHECKF(!check_ep(Ls, first, true).empty(), "%s, EP %d: a swapped answer slot went unnoticed", preset, P);
      // A record for an expert the receiver does not own is refused by name.
      MoeEpPlan p;
      plan_moe_dispatch(Ls[0], P, 0, &p);
      std::vector<std::vector<char>> recv(static_cast<size_t>(P));
      const int32_t wrong = 1;  // owned by member 1 % P = 1
      recv[0].resize(sizeof wrong);
      std::memcpy(recv[0].data(), &wrong, sizeof wrong);
      const std::string refused = plan_moe_receive(recv, E, &p);
      CHECKF(refused.find("expert 1, which member 0 does not own") != std::string::npos, "%s, EP %d: %s", preset, P,
             refused.c_str());
      recv[0].resize(3);
      CHECKF(plan_moe_receive(recv, E, &p).find("not a whole number") != std::string::npos, "%s: a ragged list", preset);
    }
  }
  return check_exit_code("test_moe_layout");
}
