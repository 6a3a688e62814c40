package twin

// The built-in roofline coefficients and where each comes from. Fits are to
// the published tables the twin keeps with its validation (eval/twinval:
// the table, the fit and its error are in docs/twin.md; `worker
// twin-validate --fit` recomputes every fit and a test checks these values
// against it).

// Sources of the fits, quoted in the coefficients below.
const (
	srcVidurGEMM = "fit to Vidur's published H100 operator profiles (github.com/microsoft/vidur @7d47513, " +
		"data/profiling/compute/h100/meta-llama/Llama-2-{7b,70b}-hf/mlp.csv: attn_pre_proj, attn_post_proj, " +
		"mlp_up_proj, mlp_down_proj medians, FP16 cuBLAS via PyTorch, TP 1/2/4/8, 1-4096 tokens; 152 layer rows) " +
		"of the GEMM model GEMM = gemm_kernel_ms + hypot(compute of tokens rounded up to gemm_tile_tokens, weight+activation bytes / stream)"
	srcDeepGEMM = "fit to DeepGEMM's published FP8 dense-GEMM table on H800 (github.com/deepseek-ai/DeepGEMM @a6d97a1 README, " +
		"'Normal GEMMs for dense models', M 64/128/4096 x 6 N,K shapes, 18 rows; H800 has H100 SXM's compute and HBM) " +
		"with the BF16 fit's bandwidth, tile and kernel cost"
	srcNVFP4 = "fit to the published NVFP4 GEMM tables on B200 (vLLM PR #20578: its CUTLASS kernel on Llama-3.1-8B's " +
		"6144x4096 QKV weight at 1-16,384 tokens, 11 rows; torchao PR #2427: cuBLASLt through torch._scaled_mm, square " +
		"1,024-8,192, 7 rows) with the BF16 fit's bandwidth, tile and kernel cost"
	srcVidurElem = "fit to Vidur's H100 operator profiles (same files: input_layernorm, post_attention_layernorm, attn_rope, " +
		"mlp_act, add medians, 152 rows each) of elementwise = elementwise_kernel_ms + bytes / (HBM x elementwise_efficiency)"
	srcORTDecode = "fit to ONNX Runtime PR #21414's published H100 SXM paged decode table (github.com/microsoft/onnxruntime/pull/21414, " +
		"FlashAttention-2 batch decode, llama3 70B heads 64/8, head 128, page 16, 64 sequences x 32-512 tokens: GPU time " +
		"15.1-61.9 us for 11-131 MiB) of time = attention_kernel_ms + bytes / (HBM x decode_attention_efficiency)"
	srcVidurAllReduce = "fit to Vidur's published DGX H100 all-reduce profile (github.com/microsoft/vidur @7d47513, " +
		"data/profiling/network/h100_dgx/all_reduce.csv: NCCL via PyTorch, CUDA graphs, 2/4/8 GPUs, 4 KB-116 MB FP16) " +
		"of time = allreduce_latency_ms + 2(n-1)/n bytes / (nvlink x allreduce_nvlink_fraction)"
)

// defaultRoofline are the built-in coefficients, the same for every GPU:
// they were measured on Hopper (the DeepEP and cuBLAS figures also on
// Blackwell) and are assumed for Blackwell until a measured profile
// replaces them (scripts/device-check.sh, docs/twin.md "A measured profile").
func defaultRoofline() RooflineCoefficients {
	return RooflineCoefficients{
		GEMMEfficiency: Coef{0.72, srcVidurGEMM + "; consistent with cuBLAS BF16 large GEMMs: B200 1,532-1,652 TFLOP/s " +
			"at M,N,K 4096-8192 (pyptx.dev/performance) = 68-73% of 2,250"},
		FP8GEMMEfficiency: Coef{0.68, srcDeepGEMM + "; its large-M square-ish shapes reach 1,304-1,358 of 1,979 TFLOP/s (66-69%)"},
		FP4GEMMEfficiency: Coef{0.47, srcNVFP4 + "; the large problems reach 3,904 (vLLM, 16,384 tokens) and 5,365 " +
			"(torchao, 8,192 cubed) of 9,000 TFLOP/s (43 and 60%)"},
		GEMMBandwidthEfficiency: Coef{0.94, srcVidurGEMM + "; Llama-2-70B's widest GEMMs stream weights at 2.9-3.0 of " +
			"3.35 TB/s at 1-128 tokens (87-91%)"},
		GEMMTileTokens: Coef{64, srcVidurGEMM + "; the measured times jump where the tokens pass a multiple of 64 or 128 " +
			"(tile quantization, NVIDIA Deep Learning Performance guide: 'Matrix Multiplication Background', Tile Quantization)"},
		GEMMKernelMS: Coef{0.005, srcVidurGEMM + "; Llama-2-7B at TP 8 runs a 4096x512 GEMM (4 MB) in 4 us"},
		PrefillAttentionEfficiency: Coef{0.65, "FlashAttention-3 (Shah et al., arXiv:2407.08608): BF16 forward 'up to 740 TFLOPs/s " +
			"(75% utilization)' on H100 SXM5 at long sequences; causal masks and the 512-2k token chunks of chunked prefill run " +
			"lower, so 0.65 chosen; FlashMLA's compute-bound MLA decode reaches 660 TFLOP/s on H800 (67%, FlashMLA README)"},
		DecodeAttentionEfficiency: Coef{0.80, srcORTDecode + " (slope 2.75 TB/s of 3.35); FlashMLA reaches up to 3,000 of " +
			"H800's 3,350 GB/s (90%) memory-bound (FlashMLA README)"},
		AttentionKernelMS: Coef{0.012, srcORTDecode + " (intercept); FlashInfer's batch-1 paged decode of Llama-3-8B heads at 4k " +
			"tokens takes 12 us on B300 for ~2 us of traffic (github.com/ROCm/aiter/issues/2495); the context kernel is " +
			"assumed to pay the same launch and tail"},
		ElementwiseEfficiency: Coef{0.72, srcVidurElem + " (unfused PyTorch/vLLM-era kernels: RMSNorm 40-44%, SiLU-mul 58%, " +
			"RoPE 52% of HBM at 4096 tokens; fused TensorRT-LLM kernels likely do better)"},
		ElementwiseKernelMS: Coef{0.003, srcVidurElem + " (a norm of 1-64 tokens takes 4 us, a residual add 1-2 us)"},
		CommEfficiency: Coef{0.75, "DeepEP (github.com/deepseek-ai/DeepEP docs/legacy.md): intranode EP8 dispatch 153 GB/s, " +
			"combine 158 GB/s on H800, whose NVLink is 400 GB/s both ways = 200 GB/s per direction (77-79%); DeepEP V2 README: " +
			"726/740 GB/s on SM100 EP8 of 900 GB/s per direction (81-82%); 0.75 chosen"},
		CommLatencyMS: Coef{0.015, "assumption: ~15 us fixed cost per NVLink dispatch or combine (launch, notify and " +
			"synchronisation), the order of small-message NCCL latency inside one NVSwitch node"},
		AllReduceNVLinkFraction: Coef{1.52, srcVidurAllReduce + ": 700 GB/s ring bus bandwidth of 450 GB/s per direction " +
			"(NVLS reduces in the switch)"},
		AllReduceLatencyMS: Coef{0.025, srcVidurAllReduce + " (intercept; 7-38 us for 4 KB)"},
		RDMAEfficiency: Coef{0.86, "DeepEP docs/legacy.md, normal kernels on H800 with CX7 400 Gb/s (~50 GB/s): internode EP16 " +
			"dispatch and combine 43 GB/s RDMA bottleneck bandwidth = 86% (EP32 58, EP64 51 GB/s count some local traffic)"},
		RDMALatencyMS: Coef{0.010, "assumption: ~10 us more per collective that crosses the network (one-way InfiniBand " +
			"RDMA write latency of a few us plus the proxy and completion handshakes)"},
		ExpertZipf: Coef{0, "assumption: uniform routing (set a Zipf exponent, e.g. 0.5-1, to model hot experts: " +
			"--expert-zipf)"},
		StepOverheadMS: Coef{0.10, "assumption: fixed per-step device work outside the layers (input, position and " +
			"block-table upload, sampling, result download and sync) ~0.1 ms; replace with a measured profile"},
		LayerOverheadMS: Coef{0.020, "assumption: ~10 kernels per layer x ~2 us launch gap each without CUDA graphs " +
			"(launch cost is not hidden when kernels are short); the kernels' own fixed costs are the *_kernel_ms figures"},
		GraphLayerOverheadMS: Coef{0.008, "assumption: pure-decode steps replay a CUDA graph (as vLLM, SGLang and " +
			"TensorRT-LLM do), leaving ~10 kernels x ~0.8 us of inter-kernel gap per layer"},
		ReserveBytes: Coef{2e9, "assumption: 2 GB per GPU for the CUDA context, cuBLAS and attention workspaces and NCCL buffers"},
		ReserveFraction: Coef{0.10, "the CUDA engine's default --gpu-mem-fraction 0.9 (cmd/worker): 10% of the memory " +
			"left after weights and reserve_bytes stays free for activations and allocator headroom"},
	}
}
