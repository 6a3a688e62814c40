// moe_layout.h: the CUDA backend's host-side mixture-of-experts layout of a
// step, in plain C++ (no CUDA header), built in every configuration so that
// native/tests/test_moe_layout.cpp checks it on machines without CUDA.
//
// A MoE layer on the device (model_cuda.cu, docs/cuda.md "Mixture of
// experts"): the router's logits [rows][E] come back to the host, which
// routes every row with the CPU engine's own rule (moe_route_row: the same
// top-k, ties, groups, bias and weights) and builds this layout; the device
// then gathers the rows by expert, runs each expert's SwiGLU as GEMMs over
// its rows, and combines every row's answers in ascending expert id.
//   slots      the permuted rows: expert 0's (row, k) pairs in row order,
//              then expert 1's, ...; src_row[s] is the row slot s copies
//   offsets    expert e's slots are [offsets[e], offsets[e + 1])
//   slot_of    [rows][K]: the slot of row r's k-th expert (ascending id)
//   weight     [rows][K]: its router weight (float32)
// The device buffer is one int32 block: src_row[total], slot_of[rows*K],
// then weight[rows*K] as float bits (device_words(); one copy per layer).
#ifndef LOCKSTEP_CUDA_MOE_LAYOUT_H
#define LOCKSTEP_CUDA_MOE_LAYOUT_H

#include <cstdint>
#include <vector>

#include "engine.h"

namespace lockstep {

struct MoeLayout {
  int64_t rows = 0;
  int32_t experts = 0, top_k = 0;
  std::vector<int32_t> expert;    // [rows][K] the chosen experts, ascending per row
  std::vector<float> weight;      // [rows][K]
  std::vector<int32_t> offsets;   // [E + 1]
  std::vector<int32_t> src_row;   // [total]
  std::vector<int32_t> slot_of;   // [rows][K]
  int64_t total() const { return offsets.empty() ? 0 : offsets.back(); }
  // Words of the device block: src_row, slot_of, weight bits.
  int64_t device_words() const { return total() + 2 * rows * top_k; }
  // Writes the device block (device_words() int32s) into out.
  void pack(int32_t* out) const;
};

// Routes `rows` rows of router logits [rows][E] for layer `layer` of shape
// (router_bias: that layer's bias [E], or null) and fills *out.
void build_moe_layout(const eng_model_shape& shape, const float* logits, int64_t rows, const float* router_bias,
                      MoeLayout* out);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MOE_LAYOUT_H
