// (e) Page copies between tiers: a sequence suspended to the host tier and
// resumed into other device pages generates exactly what it would have
// without the trip; bad indices are rejected before anything is copied.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "test_engine.h"

namespace {

constexpr int32_t kVocab = 512;
constexpr int32_t kP = 4;

struct Gen {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// Prefills prompt on pages and returns the first sampled token.
int32_t prefill(eng_engine_t e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& pages) {
  TestSeq s{prompt, 0, pages, true};
  const TestStepOut out = test_step(e, {s}, kVocab);
  REQUIRE(out.status == ENG_OK);
  return out.sampled[0];
}

// Decodes n tokens after a prompt of length plen whose last sampled token is first.
Gen decode(eng_engine_t e, int32_t first, int32_t plen, const std::vector<int32_t>& pages, int n) {
  Gen g;
  int32_t tok = first;
  for (int i = 0; i < n; ++i) {
    TestSeq s{{tok}, plen + i, pages, true};
    const TestStepOut out = test_step(e, {s}, kVocab);
    REQUIRE(out.status == ENG_OK);
    tok = out.sampled[0];
    g.tokens.push_back(tok);
    g.logits.insert(g.logits.end(), out.logits.begin(), out.logits.end());
  }
  return g;
}

bool same(const Gen& a, const Gen& b) {
  return a.tokens == b.tokens && a.logits.size() == b.logits.size() &&
         std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0;
}

bool contains(const char* s, const char* sub) { return std::strstr(s, sub) != nullptr; }

}  // namespace

int main() {
  const std::vector<int32_t> prompt_a = test_prompt(11, 10, kVocab);  // 10 tokens: 3 pages
  const std::vector<int32_t> prompt_b = test_prompt(12, 10, kVocab);
  const std::vector<int32_t> prompt_c = test_prompt(13, 12, kVocab);
  const int n = 5;  // positions 10..14 → 4 pages

  // Reference: A and B each alone, never copied.
  eng_engine_t ref = test_engine(test_config("tiny", 16, kP, 8));
  const int32_t a0 = prefill(ref, prompt_a, {0, 1, 2, 3});
  const Gen want_a = decode(ref, a0, 10, {0, 1, 2, 3}, n);
  const int32_t b0 = prefill(ref, prompt_b, {4, 5, 6, 7});
  const Gen want_b = decode(ref, b0, 10, {4, 5, 6, 7}, n);
  eng_engine_free(ref);

  eng_engine_t e = test_engine(test_config("tiny", 16, kP, 8));
  CHECK(prefill(e, prompt_a, {0, 1, 2, 3}) == a0);
  CHECK(prefill(e, prompt_b, {9, 10, 11, 12}) == b0);

  // Rejected copies change nothing: the first two pairs are valid, the third
  // is not; B's pages 9 and 10 must keep B's content.
  {
    const int32_t src[] = {0, 1, 2}, dst[] = {9, 10, 16};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, src, ENG_TIER_DEVICE, dst, 3) == ENG_INVALID_ARGUMENT);
    CHECK(contains(eng_engine_last_error(e), "dst[2]") && contains(eng_engine_last_error(e), "16"));
    const int32_t hdst[] = {0, 1, 8};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, src, ENG_TIER_HOST, hdst, 3) == ENG_INVALID_ARGUMENT);
    CHECK(contains(eng_engine_last_error(e), "dst[2]") && contains(eng_engine_last_error(e), "host"));
    const int32_t bad_src[] = {0, -1, 2};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, bad_src, ENG_TIER_DEVICE, dst, 2) == ENG_INVALID_ARGUMENT);
    CHECK(contains(eng_engine_last_error(e), "src[1]"));
    CHECK(eng_engine_copy_pages(e, static_cast<eng_tier>(2), src, ENG_TIER_DEVICE, dst, 1) == ENG_INVALID_ARGUMENT);
    CHECK(contains(eng_engine_last_error(e), "src_tier"));
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, src, ENG_TIER_DEVICE, dst, -1) == ENG_INVALID_ARGUMENT);
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, nullptr, ENG_TIER_DEVICE, dst, 1) == ENG_INVALID_ARGUMENT);
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, nullptr, ENG_TIER_DEVICE, nullptr, 0) == ENG_OK);
  }
  CHECKF(same(decode(e, b0, 10, {9, 10, 11, 12}, n), want_b), "B changed by a rejected copy");

  // Suspend A: device pages 0..2 → host 5..7; overwrite them with C; resume
  // into device pages 13, 14, 8 (via a host → host hop) and continue A there.
  {
    const int32_t dev[] = {0, 1, 2}, host[] = {5, 6, 7};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, dev, ENG_TIER_HOST, host, 3) == ENG_OK);
    prefill(e, prompt_c, {0, 1, 2});
    const int32_t host2[] = {0, 1, 2};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_HOST, host, ENG_TIER_HOST, host2, 3) == ENG_OK);
    const int32_t back[] = {13, 14, 8};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_HOST, host2, ENG_TIER_DEVICE, back, 3) == ENG_OK);
    CHECKF(same(decode(e, a0, 10, {13, 14, 8, 15}, n), want_a), "A differs after a host round trip");
  }
  // Device → device: move B (pages 9..12, now holding 15 positions) and
  // compare its continuation with the same continuation in place.
  {
    const int32_t src[] = {9, 10, 11, 12}, dst[] = {3, 4, 5, 6};
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, src, ENG_TIER_DEVICE, dst, 4) == ENG_OK);
    const int32_t last = want_b.tokens.back();
    const Gen moved = decode(e, last, 15, {3, 4, 5, 6, 7}, 3);
    const Gen in_place = decode(e, last, 15, {9, 10, 11, 12, 0}, 3);
    CHECKF(same(moved, in_place), "B differs after a device → device move");
  }
  eng_engine_free(e);

  // No host tier: every host index is out of range.
  eng_engine_t nohost = test_engine(test_config("tiny", 4, kP, 0));
  const int32_t zero = 0;
  CHECK(eng_engine_copy_pages(nohost, ENG_TIER_DEVICE, &zero, ENG_TIER_HOST, &zero, 1) == ENG_INVALID_ARGUMENT);
  CHECK(contains(eng_engine_last_error(nohost), "[0, 0)"));
  eng_engine_free(nohost);
  return check_exit_code("test_copy_pages");
}
