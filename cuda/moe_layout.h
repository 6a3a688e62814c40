// moe_layout.h: the CUDA backend's host-side mixture-of-experts layout of a
// step, in plain C++ (no CUDA header), built in every configuration so that
// native/tests/test_moe_layout.cpp checks it on machines without CUDA.
//
// A MoE layer on the device (moe_cuda.cu, docs/cuda.md "Mixture of
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
#include <string>
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

// Expert parallelism (EP over NCCL, moe_cuda.cu; docs/cuda.md): expert e
// lives on member e % members (expert_owner). A member's MoE layer then
//   1. routes its rows (MoeLayout) and sends each (row, k) pair to the owner
//      of its expert: dispatch records grouped by destination, (row, k)
//      order within one (the CPU engine's order, model_cpu.cpp moe_block);
//      the expert ids travel on the host (Exchange::alltoallv, with its tag
//      and round checks), the rows over NCCL;
//   2. groups the records it received by expert (ascending id; within one,
//      by source member, then record: the CPU engine's order) and runs each
//      owned expert over its rows;
//   3. returns every answer to its sender in record order (NCCL again), so
//      the combine finds the answer to its pair (r, k) where it sent it:
//      send_pos[r][k], and sums them in ascending expert id as on one engine.
struct MoeEpPlan {
  int32_t members = 1, me = 0;
  // Sender side (plan_moe_dispatch).
  std::vector<int32_t> send_offsets;               // [members + 1]: records to d are [send_offsets[d], [d + 1])
  std::vector<int32_t> send_row;                   // [rows * K]: the row record i copies
  std::vector<int32_t> send_pos;                   // [rows][K]: the record (and answer) of pair (r, k)
  std::vector<std::vector<char>> send_experts;     // [members]: int32 expert ids of the records to d
  // Receiver side (plan_moe_receive).
  std::vector<int32_t> recv_offsets;               // [members + 1]: records from s are [recv_offsets[s], [s + 1])
  std::vector<int32_t> grouped_offsets;            // [E + 1]: expert e's grouped slots
  std::vector<int32_t> grouped_src;                // [received]: the received record grouped slot g copies
  std::vector<int32_t> answer_slot;                // [received]: the grouped slot holding record i's answer
  int64_t sent() const { return send_offsets.empty() ? 0 : send_offsets.back(); }
  int64_t received() const { return recv_offsets.empty() ? 0 : recv_offsets.back(); }
  // Words of the device block: send_row, send_pos, weight bits (from the
  // layout), grouped_src, answer_slot.
  int64_t device_words(const MoeLayout& L) const { return sent() + 2 * L.rows * L.top_k + 2 * received(); }
  void pack(const MoeLayout& L, int32_t* out) const;
};

// Builds the sender side of *plan for member `me` of `members` from its
// layout.
void plan_moe_dispatch(const MoeLayout& L, int32_t members, int32_t me, MoeEpPlan* plan);

// Builds the receiver side of *plan from the expert ids every member sent
// this one (recv_experts[s]: int32s, as alltoallv delivers them). Returns ""
// or what is wrong with them (a ragged list, an expert out of range or not
// this member's), naming the member; the caller throws ENG_COMM_ERROR.
std::string plan_moe_receive(const std::vector<std::vector<char>>& recv_experts, int32_t experts, MoeEpPlan* plan);

// Routes `rows` rows of router logits [rows][E] for layer `layer` of shape
// (router_bias: that layer's bias [E], or null) and fills *out.
void build_moe_layout(const eng_model_shape& shape, const float* logits, int64_t rows, const float* router_bias,
                      MoeLayout* out);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MOE_LAYOUT_H
