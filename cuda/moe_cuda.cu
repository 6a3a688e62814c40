// moe_cuda.cu: the CUDA backend's mixture-of-experts layers, on one engine and under
// expert parallelism over NCCL (model_cuda.h).
#include "model_cuda.h"
#include "model_cuda_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/moe.cuh"
#include "kernels/swiglu.cuh"
#include "presets.h"

namespace lockstep {

using cuda_internal::at;

void CudaBackend::join_ep(int32_t size, int32_t rank) {
#ifndef ENGINE_HAVE_NCCL
  if (size > 1)
    throw EngineError(ENG_UNSUPPORTED,
                      "the CUDA backend's expert parallelism runs over NCCL, and this engine library was built "
                      "without NCCL (ENGINE_NCCL=OFF): run the MoE model on one attention-DP rank, or rebuild with NCCL");
#endif
  ep_size_ = size;
  ep_rank_ = rank;
  moe_stats_.layers.assign(size_t(shape_.num_layers), MoeLayerStats{});
  // Keep only this member's routed experts.
  guarded("join_ep", [&] {
    for (CudaLayer& L : layers_)
      for (size_t e = 0; e < L.experts.size(); ++e)
        if (expert_owner(int32_t(e), size) != rank) L.experts[e] = CudaExpert{};
  });
}

#ifdef ENGINE_HAVE_NCCL
// The EP group's NCCL communicator, made at the first step.
void CudaBackend::open_ep_comm() {
  if (ep_comm_) return;
  ep_comm_ = cuda_internal::open_group_nccl(ep_, ExchangeTag{ExchangeKind::kMoeDispatch, -1}, device_, stream_,
                                            kEpNcclTimeoutMs, "expert-parallel");
}
#endif

// Each expert with slots [offsets[e], offsets[e + 1]) of xe: its SwiGLU over
// them into the same rows of moe_y_.
void CudaBackend::run_experts(const CudaLayer& L, const __nv_bfloat16* xe, const std::vector<int32_t>& offsets) {
  const int64_t H = shape_.hidden_size, Fm = shape_.moe_intermediate_size;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t off = offsets[e], cnt = offsets[e + 1] - off;
    if (cnt == 0) continue;
    const CudaExpert& X = L.experts[e];
    gemm_->bf16_f32(xe + off * H, cnt, H, X.wgu.as<__nv_bfloat16>(), 2 * Fm, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), cnt, int32_t(Fm), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), cnt, Fm, X.wdown.as<__nv_bfloat16>(), H,
                    moe_y_.as<float>() + off * H, 0.0f);
  }
}

void CudaBackend::moe_mlp(int32_t layer) {
  if (ep_ != nullptr) {
    moe_mlp_ep(layer);
    return;
  }
  const CudaLayer& L = layers_[size_t(layer)];
  const int64_t H = shape_.hidden_size, E = shape_.num_experts, K = shape_.num_experts_per_tok;
  const int64_t Fm = shape_.moe_intermediate_size, Fs = int64_t(shape_.num_shared_experts) * Fm, R = desc_.rows;
  const __nv_bfloat16* x = xb_.as<__nv_bfloat16>();
  // Router logits to the host, routed there by the CPU engine's rule.
  gemm_->bf16_f32(x, R, H, L.router.as<__nv_bfloat16>(), E, moe_logits_.as<float>(), 0.0f);
  moe_host_logits_.reserve(size_t(R * E) * sizeof(float));
  CUDA_CHECK(cudaMemcpyAsync(moe_host_logits_.as<void>(), moe_logits_.as<void>(), size_t(R * E) * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  build_moe_layout(shape_, moe_host_logits_.as<float>(), R, L.router_bias.empty() ? nullptr : L.router_bias.data(),
                   &moe_layout_);
  const int64_t words = moe_layout_.device_words(), S = moe_layout_.total();
  moe_host_desc_.reserve(size_t(words) * sizeof(int32_t));
  moe_layout_.pack(moe_host_desc_.as<int32_t>());
  CUDA_CHECK(cudaMemcpyAsync(moe_desc_.as<void>(), moe_host_desc_.as<void>(), size_t(words) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  const int32_t* src_row = moe_desc_.as<int32_t>();
  const int32_t* slot_of = src_row + S;
  const float* weight = reinterpret_cast<const float*>(slot_of + R * K);
  // Rows by expert, each expert's SwiGLU over its rows.
  __nv_bfloat16* xe = moe_x_.as<__nv_bfloat16>();
  moe_gather(x, H, src_row, S, xe, stream_);
  run_experts(L, xe, moe_layout_.offsets);
  const float* m = nullptr;
  if (Fs > 0) {
    gemm_->bf16_f32(x, R, H, L.shared.wgu.as<__nv_bfloat16>(), 2 * Fs, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), R, int32_t(Fs), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), R, Fs, L.shared.wdown.as<__nv_bfloat16>(), H,
                    moe_m_.as<float>(), 0.0f);
    m = moe_m_.as<float>();
  }
  moe_combine(moe_y_.as<float>(), H, slot_of, weight, int32_t(K), R, m, hidden_.as<float>(), stream_);
}

// Expert parallelism (moe_layout.h MoeEpPlan): route this member's rows,
// send each (row, k) pair to its expert's member, run the owned experts over
// what arrived, send the answers back, combine as on one engine.
void CudaBackend::moe_mlp_ep(int32_t layer) {
#ifndef ENGINE_HAVE_NCCL
  (void)layer;
  throw EngineError(ENG_INTERNAL, "expert parallelism in a CUDA build without NCCL");
#else
  open_ep_comm();
  const CudaLayer& L = layers_[size_t(layer)];
  const int64_t H = shape_.hidden_size, E = shape_.num_experts, K = shape_.num_experts_per_tok;
  const int64_t Fm = shape_.moe_intermediate_size, Fs = int64_t(shape_.num_shared_experts) * Fm, R = desc_.rows;
  const __nv_bfloat16* x = xb_.as<__nv_bfloat16>();
  const ExchangeTag dtag{ExchangeKind::kMoeDispatch, layer}, ctag{ExchangeKind::kMoeCombine, layer};
  if (R > 0) {
    gemm_->bf16_f32(x, R, H, L.router.as<__nv_bfloat16>(), E, moe_logits_.as<float>(), 0.0f);
    moe_host_logits_.reserve(size_t(R * E) * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(moe_host_logits_.as<void>(), moe_logits_.as<void>(), size_t(R * E) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
  }
  // Everything queued so far has finished before any scratch below grows.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  build_moe_layout(shape_, R > 0 ? moe_host_logits_.as<float>() : nullptr, R,
                   L.router_bias.empty() ? nullptr : L.router_bias.data(), &moe_layout_);
  plan_moe_dispatch(moe_layout_, ep_size_, ep_rank_, &moe_plan_);
  std::vector<std::vector<char>> recv_ids;
  ep_->alltoallv(dtag, moe_plan_.send_experts, &recv_ids);
  const std::string why = plan_moe_receive(recv_ids, int32_t(E), &moe_plan_);
  if (!why.empty()) throw EngineError(ENG_COMM_ERROR, describe(dtag) + ": " + why);
  const int64_t S = moe_plan_.sent(), N = moe_plan_.received();
  const size_t bf = sizeof(__nv_bfloat16);
  const int64_t words = moe_plan_.device_words(moe_layout_);
  moe_desc_.reserve(size_t(std::max<int64_t>(words, 1)) * sizeof(int32_t));
  moe_send_.reserve(size_t(std::max<int64_t>(S * H, 1)) * bf);
  moe_recv_.reserve(size_t(std::max<int64_t>(N * H, 1)) * bf);
  moe_x_.reserve(size_t(std::max<int64_t>(N * H, 1)) * bf);
  moe_y_.reserve(size_t(std::max<int64_t>(N * H, 1)) * sizeof(float));
  moe_yrec_.reserve(size_t(std::max<int64_t>(N * H, 1)) * sizeof(float));
  moe_ycomb_.reserve(size_t(std::max<int64_t>(S * H, 1)) * sizeof(float));
  moe_gu_.reserve(size_t(std::max<int64_t>({N * 2 * Fm, R * 2 * Fs, 1})) * sizeof(float));
  moe_act_.reserve(size_t(std::max<int64_t>({N * Fm, R * Fs, 1})) * bf);
  moe_host_desc_.reserve(size_t(std::max<int64_t>(words, 1)) * sizeof(int32_t));
  moe_plan_.pack(moe_layout_, moe_host_desc_.as<int32_t>());
  if (words > 0)
    CUDA_CHECK(cudaMemcpyAsync(moe_desc_.as<void>(), moe_host_desc_.as<void>(), size_t(words) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
  const int32_t* send_row = moe_desc_.as<int32_t>();
  const int32_t* send_pos = send_row + S;
  const float* weight = reinterpret_cast<const float*>(send_pos + R * K);
  const int32_t* grouped_src = reinterpret_cast<const int32_t*>(weight + R * K);
  const int32_t* answer_slot = grouped_src + N;
  // Byte offsets of each member's share, rows of H bf16 (dispatch) or
  // float32 (combine).
  auto offs = [&](const std::vector<int32_t>& rec, size_t elem) {
    std::vector<int64_t> o(rec.size());
    for (size_t i = 0; i < rec.size(); ++i) o[i] = int64_t(rec[i]) * H * int64_t(elem);
    return o;
  };
  // Dispatch: rows by destination, over NCCL; then by expert.
  moe_gather(x, H, send_row, S, moe_send_.as<__nv_bfloat16>(), stream_);
  CUDA_CHECK(cudaEventRecord(ev_ep_[0].get(), stream_));
  ep_comm_->alltoallv_device(moe_send_.as<void>(), offs(moe_plan_.send_offsets, bf), moe_recv_.as<void>(),
                             offs(moe_plan_.recv_offsets, bf), describe(dtag));
  CUDA_CHECK(cudaEventRecord(ev_ep_[1].get(), stream_));
  __nv_bfloat16* xe = moe_x_.as<__nv_bfloat16>();
  moe_gather(moe_recv_.as<__nv_bfloat16>(), H, grouped_src, N, xe, stream_);
  run_experts(L, xe, moe_plan_.grouped_offsets);
  // Combine: answers back in record order, to the members that sent them.
  moe_gather_f32(moe_y_.as<float>(), H, answer_slot, N, moe_yrec_.as<float>(), stream_);
  CUDA_CHECK(cudaEventRecord(ev_ep_[2].get(), stream_));
  ep_comm_->alltoallv_device(moe_yrec_.as<void>(), offs(moe_plan_.recv_offsets, sizeof(float)),
                             moe_ycomb_.as<void>(), offs(moe_plan_.send_offsets, sizeof(float)), describe(ctag));
  CUDA_CHECK(cudaEventRecord(ev_ep_[3].get(), stream_));
  const float* m = nullptr;
  if (Fs > 0 && R > 0) {
    gemm_->bf16_f32(x, R, H, L.shared.wgu.as<__nv_bfloat16>(), 2 * Fs, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), R, int32_t(Fs), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), R, Fs, L.shared.wdown.as<__nv_bfloat16>(), H,
                    moe_m_.as<float>(), 0.0f);
    m = moe_m_.as<float>();
  }
  moe_combine(moe_ycomb_.as<float>(), H, send_pos, weight, int32_t(K), R, m, hidden_.as<float>(), stream_);
  ep_comm_->wait_done(describe(ctag));  // the layer's exchanges, within the timeout
  // Counters: the exchanges' device time (events), bytes to other members.
  float dispatch_ms = 0, combine_ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&dispatch_ms, ev_ep_[0].get(), ev_ep_[1].get()));
  CUDA_CHECK(cudaEventElapsedTime(&combine_ms, ev_ep_[2].get(), ev_ep_[3].get()));
  const int64_t own_sent = moe_plan_.send_offsets[size_t(ep_rank_) + 1] - moe_plan_.send_offsets[size_t(ep_rank_)];
  const int64_t own_recv = moe_plan_.recv_offsets[size_t(ep_rank_) + 1] - moe_plan_.recv_offsets[size_t(ep_rank_)];
  MoeLayerStats& ls = moe_stats_.layers[size_t(layer)];
  ++ls.calls;
  ls.dispatch_ms += dispatch_ms;
  ls.combine_ms += combine_ms;
  ls.dispatch_bytes += uint64_t((S - own_sent) * H) * bf;
  ls.combine_bytes += uint64_t((N - own_recv) * H) * sizeof(float);
  moe_stats_.exchanges += 2;
  moe_stats_.tokens_routed += uint64_t(R * K);
  moe_stats_.bytes_sent += uint64_t((S - own_sent) * H) * bf + uint64_t((N - own_recv) * H) * sizeof(float);
  moe_stats_.bytes_received += uint64_t((N - own_recv) * H) * bf + uint64_t((S - own_sent) * H) * sizeof(float);
  moe_stats_.wait_ms += double(dispatch_ms) + double(combine_ms);
  moe_stats_.last_step_wait_ms += double(dispatch_ms) + double(combine_ms);
#endif
}

}  // namespace lockstep
