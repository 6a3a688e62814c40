// test_moe: mixture-of-experts layers and expert parallelism on the CPU
// backend. The router's top-k breaks ties to the lower expert id and weights
// the experts as each family does; a batch of sequences spread over EP
// members of an in-process group (each member an engine on its own thread,
// with its own batch, one of them empty) yields bit-identical tokens and
// logits to one engine running them all, for EP 2, 3 and 4; a member that
// stops arriving makes the others fail with ENG_TIMEOUT naming the layer
// and the exchange; joins are validated.
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "model_cpu.h"
#include "test_engine.h"

namespace {

using lockstep::moe_route_row;

void check_router() {
  std::vector<char> taken;
  int32_t ex[3];
  float w[3];
  // Ties go to the lower id; the chosen come back in ascending id order.
  const float tie[6] = {0.5f, 2.0f, 1.0f, 2.0f, 1.0f, -3.0f};
  moe_route_row(tie, 6, 3, ENG_ROUTER_TOPK_SOFTMAX, ex, w, taken);
  CHECK(ex[0] == 1 && ex[1] == 2 && ex[2] == 3);
  // Mixtral: softmax over the k chosen logits.
  {
    const double a = std::exp(0.0), b = std::exp(-1.0), c = std::exp(0.0);
    CHECK(w[0] == static_cast<float>(a / (a + b + c)));
    CHECK(w[1] == static_cast<float>(b / (a + b + c)));
    CHECK(w[2] == static_cast<float>(c / (a + b + c)));
  }
  // Qwen3: softmax over every expert, then renormalised over the k: the
  // same weights mathematically, within rounding.
  moe_route_row(tie, 6, 3, ENG_ROUTER_SOFTMAX_TOPK, ex, w, taken);
  CHECK(ex[0] == 1 && ex[1] == 2 && ex[2] == 3);
  CHECK(std::fabs(w[0] - 1 / (2 + std::exp(-1.0))) < 1e-6);
  CHECK(std::fabs(w[0] + w[1] + w[2] - 1.0) < 1e-6);
  // top-1 of all-equal logits: expert 0, weight 1.
  const float flat[4] = {1, 1, 1, 1};
  moe_route_row(flat, 4, 1, ENG_ROUTER_SOFTMAX_TOPK, ex, w, taken);
  CHECK(ex[0] == 0 && w[0] == 1.0f);

  // DeepSeek-V2: softmax over every expert, top-k, not renormalised, scaled.
  lockstep::RouteParams rp;
  rp.E = 6;
  rp.K = 3;
  rp.norm = ENG_ROUTER_SOFTMAX_TOPK_RAW;
  rp.scaling = 2.0;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(ex[0] == 1 && ex[1] == 2 && ex[2] == 3);
  {
    double all = 0;
    for (float l : tie) all += std::exp(double(l) - 2.0);
    CHECK(w[0] == static_cast<float>(std::exp(0.0) / all * 2.0));
    CHECK(w[1] == static_cast<float>(std::exp(-1.0) / all * 2.0));
  }
  // DeepSeek-V3: sigmoid scores; the bias moves the choice (expert 5 wins
  // with +10, expert 1 loses with -10) but not the weights, which are the
  // unbiased scores renormalised over the k, times the scaling.
  const float bias[6] = {0, -10, 0, 0, 0, 10};
  rp.norm = ENG_ROUTER_SIGMOID_TOPK;
  rp.bias = bias;
  rp.scaling = 2.5;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(ex[0] == 2 && ex[1] == 3 && ex[2] == 5);
  {
    auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
    const double a = sig(1.0), b = sig(2.0), c = sig(-3.0), sum = a + b + c;
    CHECK(w[0] == static_cast<float>(a / sum * 2.5));
    CHECK(w[1] == static_cast<float>(b / sum * 2.5));
    CHECK(w[2] == static_cast<float>(c / sum * 2.5));
  }
  rp.norm = ENG_ROUTER_SIGMOID_TOPK_RAW;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(w[0] == static_cast<float>(1.0 / (1.0 + std::exp(-1.0)) * 2.5));
  // Groups: 3 groups of 2 ({0,1}, {2,3}, {4,5}); a sigmoid group scores
  // the sum of its two best biased scores. With no bias group {2,3} (1, 2)
  // beats {0,1} (0.5, 2) and {4,5}; one group used: experts 2 and 3 only.
  rp.bias = nullptr;
  rp.norm = ENG_ROUTER_SIGMOID_TOPK;
  rp.K = 2;
  rp.groups = 3;
  rp.groups_used = 1;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(ex[0] == 2 && ex[1] == 3);
  // A softmax router's group scores its best: {0,1} and {2,3} tie at 2.0,
  // the lower group wins: experts 0 and 1.
  rp.norm = ENG_ROUTER_SOFTMAX_TOPK;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(ex[0] == 0 && ex[1] == 1);
  // Two groups used: the top-2 of {0,1,2,3}.
  rp.groups_used = 2;
  moe_route_row(tie, rp, ex, w, taken);
  CHECK(ex[0] == 1 && ex[1] == 3);
}

// A request: prompt, then decodes fed with the previous sample.
struct Req {
  std::vector<int32_t> prompt;
  int32_t chunk;  // prefill chunk size
  int32_t first_page;
};

constexpr int32_t kV = 512, kP = 4, kDecodes = 4;

std::vector<int32_t> blocks_of(const Req& r) {
  std::vector<int32_t> b;
  for (int32_t i = 0; i < 16; ++i) b.push_back(r.first_page + i);
  return b;
}

// Runs `reqs` on engine e, all sequences in each step; every step is a
// lockstep point. steps: the number of steps to run (a member with fewer
// requests runs empty steps). Returns per request the sampled tokens and the
// logits of every sampled row, concatenated.
struct ReqOut {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};
std::vector<ReqOut> run_member(eng_engine_t e, const std::vector<Req>& reqs, int32_t steps, std::string* err) {
  std::vector<ReqOut> out(reqs.size());
  std::vector<int32_t> pos(reqs.size(), 0), last(reqs.size(), 0), gen(reqs.size(), 0);
  for (int32_t s = 0; s < steps; ++s) {
    std::vector<TestSeq> seqs;
    std::vector<size_t> who;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Req& r = reqs[i];
      const int32_t plen = static_cast<int32_t>(r.prompt.size());
      if (pos[i] < plen) {
        const int32_t n = std::min(r.chunk, plen - pos[i]);
        seqs.push_back({std::vector<int32_t>(r.prompt.begin() + pos[i], r.prompt.begin() + pos[i] + n), pos[i],
                        blocks_of(r), pos[i] + n == plen});
      } else if (gen[i] < kDecodes) {
        seqs.push_back({{last[i]}, pos[i], blocks_of(r), true});
      } else {
        continue;
      }
      who.push_back(i);
    }
    TestStepOut o = test_step(e, seqs, kV);
    if (o.status != ENG_OK) {
      *err = eng_engine_last_error(e);
      return out;
    }
    size_t lrow = 0;
    for (size_t j = 0; j < who.size(); ++j) {
      const size_t i = who[j];
      pos[i] += static_cast<int32_t>(seqs[j].tokens.size());
      if (!seqs[j].sample) continue;
      last[i] = o.sampled[j];
      ++gen[i];
      out[i].tokens.push_back(o.sampled[j]);
      out[i].logits.insert(out[i].logits.end(), o.logits.begin() + lrow * kV, o.logits.begin() + (lrow + 1) * kV);
      ++lrow;
    }
  }
  return out;
}

std::vector<Req> make_reqs() {
  std::vector<Req> reqs;
  const int32_t lens[] = {9, 23, 5, 31, 14, 2, 17};
  const int32_t chunks[] = {9, 8, 3, 16, 5, 2, 4};
  for (int32_t i = 0; i < 7; ++i) reqs.push_back({test_prompt(100 + i, lens[i], kV), chunks[i], i * 16});
  return reqs;
}

void check_ep(int32_t ep, const char* preset = "moe-tiny", uint64_t moe_layers = 3) {
  const std::vector<Req> reqs = make_reqs();
  const int32_t steps = 16;
  // Reference: one engine, no EP group.
  eng_engine_t ref = test_engine(test_config(preset, 128, kP));
  std::string err;
  const std::vector<ReqOut> want = run_member(ref, reqs, steps, &err);
  CHECKF(err.empty(), "reference: %s", err.c_str());
  eng_engine_free(ref);
  for (const ReqOut& o : want) CHECK(o.tokens.size() == kDecodes);

  // EP: request i on member (i * 5) % ep, with other chunkings; the last
  // member gets none when ep > 2 (it runs empty steps only).
  eng_cp_group_t group = nullptr;
  REQUIRE(eng_cp_group_create(ep, 20000, &group) == ENG_OK);
  std::vector<eng_engine_t> engines(static_cast<size_t>(ep));
  std::vector<std::vector<Req>> mine(static_cast<size_t>(ep));
  std::vector<std::vector<size_t>> ids(static_cast<size_t>(ep));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const int32_t m = ep > 2 ? static_cast<int32_t>(i) % (ep - 1) : static_cast<int32_t>(i * 5) % ep;
    Req r = reqs[i];
    r.chunk = 1 + (r.chunk * 3) % 7;
    mine[m].push_back(r);
    ids[m].push_back(i);
  }
  for (int32_t r = 0; r < ep; ++r) {
    engines[r] = test_engine(test_config(preset, 128, kP));
    REQUIRE(eng_engine_join_ep(engines[r], group, r) == ENG_OK);
  }
  CHECK(eng_engine_join_ep(engines[0], group, 0) == ENG_INVALID_ARGUMENT);  // only once
  eng_cp_group_free(group);
  std::vector<std::vector<ReqOut>> got(static_cast<size_t>(ep));
  std::vector<std::string> errs(static_cast<size_t>(ep));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < ep; ++r)
    threads.emplace_back([&, r] { got[r] = run_member(engines[r], mine[r], 40, &errs[r]); });
  for (auto& t : threads) t.join();
  for (int32_t r = 0; r < ep; ++r) {
    CHECKF(errs[r].empty(), "ep %d member %d: %s", ep, r, errs[r].c_str());
    for (size_t j = 0; j < ids[r].size(); ++j) {
      const size_t i = ids[r][j];
      CHECKF(got[r][j].tokens == want[i].tokens, "ep %d member %d request %zu: tokens differ", ep, r, i);
      CHECKF(got[r][j].logits == want[i].logits, "ep %d member %d request %zu: logits differ", ep, r, i);
    }
    eng_moe_stats st;
    REQUIRE(eng_engine_moe_stats(engines[r], &st) == ENG_OK);
    CHECKF(st.exchanges == 2u * moe_layers * 40u, "ep %d member %d: %llu exchanges, want 2 per MoE layer per step", ep, r,
           static_cast<unsigned long long>(st.exchanges));
    CHECK(ep == 1 || st.bytes_received > 0);
    eng_engine_free(engines[r]);
  }
}

}  // namespace

int main() {
  check_router();
  check_ep(1);
  check_ep(2);
  check_ep(3);
  check_ep(4);
  // deepseek-tiny: MLA, a leading dense layer (no exchange), 2 MoE layers
  // with grouped sigmoid routing and a shared expert.
  check_ep(1, "deepseek-tiny", 2);
  check_ep(3, "deepseek-tiny", 2);
  check_ep(4, "deepseek-tiny", 2);

  // A member that stops arriving: the other fails with ENG_TIMEOUT naming
  // the MoE exchange and its layer.
  {
    eng_cp_group_t group = nullptr;
    REQUIRE(eng_cp_group_create(2, 200, &group) == ENG_OK);
    eng_engine_t a = test_engine(test_config("moe-tiny", 8, 4));
    eng_engine_t b = test_engine(test_config("moe-tiny", 8, 4));
    REQUIRE(eng_engine_join_ep(a, group, 0) == ENG_OK);
    REQUIRE(eng_engine_join_ep(b, group, 1) == ENG_OK);
    eng_cp_group_free(group);
    TestStepOut o = test_step(a, {{{1, 2, 3}, 0, {0}, true}}, kV);
    CHECK(o.status == ENG_TIMEOUT);
    const std::string msg = eng_engine_last_error(a);
    CHECKF(msg.find("MoE dispatch exchange at layer 0") != std::string::npos, "message: %s", msg.c_str());
    eng_engine_free(a);
    eng_engine_free(b);
  }
  // Joins: a dense model has no experts; after the first step is too late.
  {
    eng_cp_group_t group = nullptr;
    REQUIRE(eng_cp_group_create(2, 1000, &group) == ENG_OK);
    eng_engine_t d = test_engine(test_config("tiny", 8, 4));
    CHECK(eng_engine_join_ep(d, group, 0) == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_engine_last_error(d)).find("dense") != std::string::npos);
    eng_engine_free(d);
    eng_engine_t m = test_engine(test_config("moe-tiny", 8, 4));
    CHECK(eng_engine_join_ep(m, group, 2) == ENG_INVALID_ARGUMENT);
    CHECK(test_step(m, {{{1}, 0, {0}, true}}, kV).status == ENG_OK);
    CHECK(eng_engine_join_ep(m, group, 0) == ENG_INVALID_ARGUMENT);
    eng_engine_free(m);
    eng_cp_group_free(group);
  }
  return check_exit_code("test_moe");
}
