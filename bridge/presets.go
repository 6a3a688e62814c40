package bridge

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Presets are the model shapes known by name. They must equal the native
// presets (native/src/presets.cpp); bridge/native tests compare the two.
var Presets = map[string]ModelShape{
	// tiny: fast on the CPU engine; GQA 2:1.
	"tiny": {NumLayers: 2, HiddenSize: 64, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		IntermediateSize: 128, VocabSize: 512, RopeTheta: 10000, RMSEps: 1e-5},
	// llama-8b: Llama 3 8B shape (GQA 4:1).
	"llama-8b": {NumLayers: 32, HiddenSize: 4096, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 14336, VocabSize: 128256, RopeTheta: 500000, RMSEps: 1e-5},
	// llama-70b: Llama 3 70B shape (GQA 8:1).
	"llama-70b": {NumLayers: 80, HiddenSize: 8192, NumHeads: 64, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 28672, VocabSize: 128256, RopeTheta: 500000, RMSEps: 1e-5},
	// gemma-tiny: every field of Gemma's decoders at once: GELU MLP, post
	// norms, q/k norms, heads wider than hidden / heads, the embedding times
	// sqrt(hidden), soft caps that bite on its synthetic weights, a window of
	// 8 on layers 0 and 1 with their own RoPE base beside a linearly scaled
	// global layer 2.
	"gemma-tiny": {NumLayers: 3, HiddenSize: 64, NumHeads: 4, NumKVHeads: 2, HeadDim: 32,
		IntermediateSize: 128, VocabSize: 512, RopeTheta: 1000000, RMSEps: 1e-6, QKNorm: true,
		EmbeddingScale: 8, MLPGelu: true, PostNorms: true, AttnSoftcap: 2, FinalSoftcap: 3,
		SlidingWindow: 8, SlidingWindowPattern: 3, RopeLocalTheta: 10000, RopeLinearFactor: 4},
	// moe-tiny: fast on the CPU engine: 16 experts, top-2, one shared expert.
	"moe-tiny": {NumLayers: 3, HiddenSize: 64, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		IntermediateSize: 128, VocabSize: 512, RopeTheta: 10000, RMSEps: 1e-5,
		NumExperts: 16, NumExpertsPerTok: 2, MoEIntermediateSize: 32, NumSharedExperts: 1, RouterNorm: RouterSoftmaxTopK},
	// qwen3-30b-a3b: Qwen3-30B-A3B config.json (huggingface.co/Qwen/Qwen3-30B-A3B):
	// 128 experts, top-8, softmax/top-k/renormalised (norm_topk_prob), expert
	// width 768, no shared expert; head_dim 128 with hidden 2048; per-head
	// q/k RMSNorm.
	"qwen3-30b-a3b": {NumLayers: 48, HiddenSize: 2048, NumHeads: 32, NumKVHeads: 4, HeadDim: 128,
		IntermediateSize: 6144, VocabSize: 151936, RopeTheta: 1000000, RMSEps: 1e-6,
		NumExperts: 128, NumExpertsPerTok: 8, MoEIntermediateSize: 768, RouterNorm: RouterSoftmaxTopK, QKNorm: true},
	// mixtral-8x7b: Mixtral-8x7B-v0.1 config.json (huggingface.co/mistralai/Mixtral-8x7B-v0.1):
	// 8 experts, top-2, top-k then softmax, expert width 14336, no shared expert.
	"mixtral-8x7b": {NumLayers: 32, HiddenSize: 4096, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 14336, VocabSize: 32000, RopeTheta: 1000000, RMSEps: 1e-5,
		NumExperts: 8, NumExpertsPerTok: 2, MoEIntermediateSize: 14336, RouterNorm: RouterTopKSoftmax},
	// deepseek-tiny: fast on the CPU engine: MLA (q and kv LoRA), one
	// leading dense layer, 16 experts in 4 groups (2 used), top-4, one
	// shared expert, a sigmoid router with routed scaling.
	"deepseek-tiny": deepseekShape(3, 64, 4, 32, 32, 16, 8, 16, 128, 512, 10000, 16, 4, 32, 1, 1, 2.5, 4, 2, nil),
	// deepseek-v3: DeepSeek-V3 config.json (huggingface.co/deepseek-ai/DeepSeek-V3):
	// MLA (q_lora 1536, kv_lora 512, nope 128, rope 64, v 128), 3 dense
	// layers, 256 experts in 8 groups (4 used), top-8, 1 shared, sigmoid
	// router with its bias, routed scaling 2.5, YaRN factor 40 over 4096.
	"deepseek-v3": deepseekShape(61, 7168, 128, 1536, 512, 128, 64, 128, 18432, 129280, 10000, 256, 8, 2048, 1, 3, 2.5, 8, 4,
		&YarnScaling{Factor: 40, OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 1}),
	// kimi-k2: Kimi-K2-Instruct config.json (huggingface.co/moonshotai/Kimi-K2-Instruct):
	// DeepSeek-V3's architecture with 64 heads, 384 experts (no groups), 1
	// dense layer, routed scaling 2.827, rope_theta 50000, YaRN factor 32.
	"kimi-k2": deepseekShape(61, 7168, 64, 1536, 512, 128, 64, 128, 18432, 163840, 50000, 384, 8, 2048, 1, 1, 2.827, 0, 0,
		&YarnScaling{Factor: 32, OriginalMaxPositions: 4096, BetaFast: 1, BetaSlow: 1, MScale: 1, MScaleAllDim: 1}),
}

// deepseekShape is a DeepSeek-V3-architecture shape (native presets.cpp's
// deepseek_shape): MLA, dense leading layers, a sigmoid router.
func deepseekShape(layers, hidden, heads, qLora, kvLora, nope, rope, v, inter, vocab int, theta float32,
	experts, topK, moeInter, shared, dense int, scaling float32, groups, groupsUsed int, yarn *YarnScaling) ModelShape {
	return ModelShape{NumLayers: layers, HiddenSize: hidden, NumHeads: heads, NumKVHeads: heads, HeadDim: nope + rope,
		IntermediateSize: inter, VocabSize: vocab, RopeTheta: theta, RMSEps: 1e-6,
		NumExperts: experts, NumExpertsPerTok: topK, MoEIntermediateSize: moeInter, NumSharedExperts: shared,
		RouterNorm: RouterSigmoidTopK, QLoraRank: qLora, KVLoraRank: kvLora, QKNopeHeadDim: nope, QKRopeHeadDim: rope,
		VHeadDim: v, FirstDenseLayers: dense, RoutedScalingFactor: scaling, ExpertGroups: groups, ExpertGroupsUsed: groupsUsed,
		Yarn: yarn}
}

// PresetNames lists the preset names in sorted order.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupPreset returns a preset's shape or an error listing the allowed names.
func LookupPreset(name string) (ModelShape, error) {
	s, ok := Presets[name]
	if !ok {
		return ModelShape{}, fmt.Errorf("unknown model preset %q (allowed: %s)", name, strings.Join(PresetNames(), ", "))
	}
	return s, nil
}

// Validate checks a shape's internal consistency; the error names the field.
func (s ModelShape) Validate() error {
	for _, f := range []struct {
		name string
		v    float32
	}{{"embedding_scale", s.EmbeddingScale}, {"residual_scale", s.ResidualScale}, {"attention_scale", s.AttentionScale}, {"logit_scale", s.LogitScale}} {
		if !(f.v >= 0) || math.IsInf(float64(f.v), 0) {
			return fmt.Errorf("model shape: %s must be >= 0 and finite (0 = none), got %g", f.name, f.v)
		}
		if f.v != 0 && s.KVLoraRank > 0 {
			return fmt.Errorf("model shape: MLA with Granite's multipliers (%s) is not supported", f.name)
		}
	}
	switch {
	case s.NumLayers <= 0:
		return fmt.Errorf("model shape: num_layers must be positive, got %d", s.NumLayers)
	case s.NumHeads <= 0:
		return fmt.Errorf("model shape: num_heads must be positive, got %d", s.NumHeads)
	case s.NumKVHeads <= 0 || s.NumHeads%s.NumKVHeads != 0:
		return fmt.Errorf("model shape: num_kv_heads must be positive and divide num_heads (%d), got %d", s.NumHeads, s.NumKVHeads)
	case s.HeadDim <= 0 || s.HeadDim%2 != 0:
		return fmt.Errorf("model shape: head_dim must be positive and even, got %d", s.HeadDim)
	case s.HiddenSize <= 0:
		return fmt.Errorf("model shape: hidden_size must be positive, got %d", s.HiddenSize)
	case int64(s.NumHeads)*int64(s.HeadDim) > 1<<31-1:
		return fmt.Errorf("model shape: num_heads*head_dim (%d) exceeds the int32 range", int64(s.NumHeads)*int64(s.HeadDim))
	case s.IntermediateSize <= 0:
		return fmt.Errorf("model shape: intermediate_size must be positive, got %d", s.IntermediateSize)
	case s.VocabSize <= 1:
		return fmt.Errorf("model shape: vocab_size must be at least 2, got %d", s.VocabSize)
	case !(s.RopeTheta > 0) || math.IsInf(float64(s.RopeTheta), 0):
		return fmt.Errorf("model shape: rope_theta (rope.freq_base) must be positive and finite, got %g", s.RopeTheta)
	case !(s.RMSEps > 0) || math.IsInf(float64(s.RMSEps), 0):
		return fmt.Errorf("model shape: rms_eps must be positive and finite, got %g", s.RMSEps)
	}
	if err := s.validateMoE(); err != nil {
		return err
	}
	if err := s.validateGemma(); err != nil {
		return err
	}
	if err := s.validateMLA(); err != nil {
		return err
	}
	if r := s.RopeScaling; r != nil {
		switch {
		case !(r.Factor > 1):
			return fmt.Errorf("model shape: rope_scaling factor must be > 1, got %g", r.Factor)
		case !(r.LowFreqFactor >= 1):
			return fmt.Errorf("model shape: rope_scaling low_freq_factor must be >= 1, got %g", r.LowFreqFactor)
		case !(r.HighFreqFactor > r.LowFreqFactor):
			return fmt.Errorf("model shape: rope_scaling high_freq_factor must exceed low_freq_factor (%g), got %g", r.LowFreqFactor, r.HighFreqFactor)
		case r.OriginalMaxPositions <= 0:
			return fmt.Errorf("model shape: rope_scaling original_max_position_embeddings must be positive, got %d", r.OriginalMaxPositions)
		}
	}
	return nil
}

// validateGemma checks Gemma's fields (native validate_gemma_fields' rules
// and wording).
func (s ModelShape) validateGemma() error {
	for _, f := range []struct {
		name string
		v    float32
	}{{"attn_softcap", s.AttnSoftcap}, {"final_softcap", s.FinalSoftcap}, {"rope_local_theta", s.RopeLocalTheta}} {
		if !(f.v >= 0) || math.IsInf(float64(f.v), 0) {
			return fmt.Errorf("model shape: %s must be >= 0 and finite (0 = none), got %g", f.name, f.v)
		}
	}
	switch {
	case s.SlidingWindow < 0:
		return fmt.Errorf("model shape: sliding_window must be >= 0 (0 = none), got %d", s.SlidingWindow)
	case s.SlidingWindowPattern < 0 || s.SlidingWindowPattern == 1:
		return fmt.Errorf("model shape: sliding_window_pattern must be 0 (every layer slides) or >= 2 (every p-th layer is global), got %d", s.SlidingWindowPattern)
	case s.SlidingWindow == 0 && (s.SlidingWindowPattern != 0 || s.RopeLocalTheta != 0):
		return fmt.Errorf("model shape: sliding_window_pattern and rope_local_theta need a sliding_window")
	case s.RopeLinearFactor != 0 && (!(s.RopeLinearFactor > 1) || math.IsInf(float64(s.RopeLinearFactor), 0)):
		return fmt.Errorf("model shape: rope_linear_factor must be 0 (none) or > 1 and finite, got %g", s.RopeLinearFactor)
	case s.RopeLinearFactor != 0 && (s.RopeScaling != nil || s.Yarn != nil):
		return fmt.Errorf("model shape: rope_linear_factor with rope_scaling_factor or yarn_factor; a shape has one RoPE scaling")
	case s.RopeLinearFactor != 0 && s.SlidingWindow > 0 && s.SlidingWindowPattern == 0:
		return fmt.Errorf("model shape: rope_linear_factor scales the layers that do not slide; with sliding_window_pattern 0 every layer slides")
	}
	any := s.MLPGelu || s.PostNorms || s.AttnSoftcap != 0 || s.FinalSoftcap != 0 || s.SlidingWindow != 0 || s.RopeLocalTheta != 0 || s.RopeLinearFactor != 0
	if any && s.KVLoraRank > 0 {
		return fmt.Errorf("model shape: MLA with Gemma's fields (mlp_gelu, post_norms, soft-capping, sliding window, local or linear RoPE) is not supported")
	}
	if (s.MLPGelu || s.PostNorms) && s.NumExperts > 0 {
		return fmt.Errorf("model shape: mlp_gelu and post_norms are supported on dense shapes only (num_experts 0)")
	}
	// Partial RoPE and LongRoPE's attention factor.
	switch {
	case s.PartialRotaryDim < 0 || s.PartialRotaryDim%2 != 0 || s.PartialRotaryDim > s.HeadDim:
		return fmt.Errorf("model shape: partial_rotary_dim must be 0 (the whole head) or even and at most head_dim (%d), got %d", s.HeadDim, s.PartialRotaryDim)
	case s.PartialRotaryDim != 0 && s.KVLoraRank > 0:
		return fmt.Errorf("model shape: partial_rotary_dim with MLA (qk_rope_head_dim says it) is not supported")
	case !(s.RopeAttnFactor >= 0) || math.IsInf(float64(s.RopeAttnFactor), 0):
		return fmt.Errorf("model shape: rope_attn_factor must be >= 0 and finite (0 = 1), got %g", s.RopeAttnFactor)
	case s.RopeAttnFactor != 0 && s.Yarn != nil:
		return fmt.Errorf("model shape: rope_attn_factor with yarn_factor; YaRN sets its own magnitude")
	}
	return nil
}

// validateMoE checks the mixture-of-experts fields (native validate_shape's
// rules and wording).
func (s ModelShape) validateMoE() error {
	if s.NumExperts < 0 {
		return fmt.Errorf("model shape: num_experts must be >= 0 (0 = dense), got %d", s.NumExperts)
	}
	if s.NumExperts == 0 {
		if s.NumExpertsPerTok != 0 || s.MoEIntermediateSize != 0 || s.NumSharedExperts != 0 || s.RouterNorm != 0 {
			return fmt.Errorf("model shape: num_experts_per_tok, moe_intermediate_size, num_shared_experts and router_norm must be 0 for a dense model (num_experts 0)")
		}
		return nil
	}
	switch {
	case s.NumExpertsPerTok < 1 || s.NumExpertsPerTok > s.NumExperts:
		return fmt.Errorf("model shape: num_experts_per_tok must be in [1, num_experts (%d)], got %d", s.NumExperts, s.NumExpertsPerTok)
	case s.MoEIntermediateSize <= 0:
		return fmt.Errorf("model shape: moe_intermediate_size must be positive, got %d", s.MoEIntermediateSize)
	case s.NumSharedExperts < 0:
		return fmt.Errorf("model shape: num_shared_experts must be >= 0, got %d", s.NumSharedExperts)
	case s.RouterNorm < RouterSoftmaxTopK || s.RouterNorm > RouterSigmoidTopKRaw:
		return fmt.Errorf("model shape: router_norm must be 0 (softmax, top-k, renormalise), 1 (top-k, softmax), 2 (softmax, top-k), "+
			"3 (sigmoid, top-k, renormalise) or 4 (sigmoid, top-k), got %d", s.RouterNorm)
	case s.FirstDenseLayers < 0 || s.FirstDenseLayers >= s.NumLayers:
		return fmt.Errorf("model shape: first_dense_layers must be in [0, num_layers (%d)), got %d", s.NumLayers, s.FirstDenseLayers)
	case !(s.RoutedScalingFactor >= 0) || math.IsInf(float64(s.RoutedScalingFactor), 0):
		return fmt.Errorf("model shape: routed_scaling_factor must be >= 0 and finite (0 = 1), got %g", s.RoutedScalingFactor)
	}
	if s.ExpertGroups != 0 || s.ExpertGroupsUsed != 0 {
		switch {
		case s.ExpertGroups < 1 || s.NumExperts%s.ExpertGroups != 0:
			return fmt.Errorf("model shape: expert_groups must divide num_experts (%d), got %d", s.NumExperts, s.ExpertGroups)
		case s.ExpertGroupsUsed < 1 || s.ExpertGroupsUsed > s.ExpertGroups:
			return fmt.Errorf("model shape: expert_groups_used must be in [1, expert_groups (%d)], got %d", s.ExpertGroups, s.ExpertGroupsUsed)
		case s.ExpertGroupsUsed*(s.NumExperts/s.ExpertGroups) < s.NumExpertsPerTok:
			return fmt.Errorf("model shape: expert_groups_used (%d) groups hold fewer experts than num_experts_per_tok (%d)", s.ExpertGroupsUsed, s.NumExpertsPerTok)
		case s.RouterNorm.Sigmoid() && s.NumExperts/s.ExpertGroups < 2:
			return fmt.Errorf("model shape: expert_groups with a sigmoid router need at least 2 experts per group (a group scores by its two best)")
		}
	}
	return nil
}

// validateMLA checks the latent-attention and YaRN fields (native
// validate_shape's rules and wording).
func (s ModelShape) validateMLA() error {
	if s.NumExperts == 0 && (s.FirstDenseLayers != 0 || s.RoutedScalingFactor != 0 || s.ExpertGroups != 0 || s.ExpertGroupsUsed != 0) {
		return fmt.Errorf("model shape: first_dense_layers, routed_scaling_factor, expert_groups and expert_groups_used must be 0 for a dense model (num_experts 0)")
	}
	if s.KVLoraRank < 0 {
		return fmt.Errorf("model shape: kv_lora_rank must be >= 0 (0 = no MLA), got %d", s.KVLoraRank)
	}
	if s.KVLoraRank == 0 {
		if s.QLoraRank != 0 || s.QKNopeHeadDim != 0 || s.QKRopeHeadDim != 0 || s.VHeadDim != 0 {
			return fmt.Errorf("model shape: q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be 0 without MLA (kv_lora_rank 0)")
		}
	} else {
		switch {
		case s.QLoraRank < 0:
			return fmt.Errorf("model shape: q_lora_rank must be >= 0 (0 = no q LoRA), got %d", s.QLoraRank)
		case s.QKNopeHeadDim <= 0:
			return fmt.Errorf("model shape: qk_nope_head_dim must be positive, got %d", s.QKNopeHeadDim)
		case s.QKRopeHeadDim <= 0 || s.QKRopeHeadDim%2 != 0:
			return fmt.Errorf("model shape: qk_rope_head_dim must be positive and even, got %d", s.QKRopeHeadDim)
		case s.VHeadDim <= 0:
			return fmt.Errorf("model shape: v_head_dim must be positive, got %d", s.VHeadDim)
		case int64(s.QKNopeHeadDim)+int64(s.QKRopeHeadDim) != int64(s.HeadDim):
			return fmt.Errorf("model shape: MLA: head_dim must equal qk_nope_head_dim + qk_rope_head_dim (%d), got %d", int64(s.QKNopeHeadDim)+int64(s.QKRopeHeadDim), s.HeadDim)
		case s.NumKVHeads != s.NumHeads:
			return fmt.Errorf("model shape: MLA: num_kv_heads must equal num_heads (%d), got %d", s.NumHeads, s.NumKVHeads)
		case s.QKNorm:
			return fmt.Errorf("model shape: MLA with qk_norm is not supported")
		case s.QKVBias:
			return fmt.Errorf("model shape: MLA with qkv_bias is not supported")
		case int64(s.NumHeads)*(int64(s.KVLoraRank)+int64(s.QKRopeHeadDim)) > 1<<31-1 || int64(s.NumHeads)*int64(s.VHeadDim) > 1<<31-1:
			return fmt.Errorf("model shape: MLA: num_heads * (kv_lora_rank + qk_rope_head_dim) or num_heads * v_head_dim exceeds the int32 range")
		}
	}
	if y := s.Yarn; y != nil {
		switch {
		case !(y.Factor > 1) || math.IsInf(float64(y.Factor), 0):
			return fmt.Errorf("model shape: yarn_factor must be 0 (none) or > 1, got %g", y.Factor)
		case s.RopeScaling != nil:
			return fmt.Errorf("model shape: yarn_factor and rope_scaling_factor are both set; a shape has one RoPE scaling")
		case s.KVLoraRank == 0:
			return fmt.Errorf("model shape: yarn_factor: YaRN is supported on MLA shapes only (DeepSeek's form; kv_lora_rank > 0)")
		case y.OriginalMaxPositions <= 0:
			return fmt.Errorf("model shape: yarn_original_max_positions must be positive, got %d", y.OriginalMaxPositions)
		case !(y.BetaSlow > 0) || !(y.BetaFast >= y.BetaSlow) || math.IsInf(float64(y.BetaFast), 0):
			return fmt.Errorf("model shape: yarn betas need beta_fast >= beta_slow > 0, got %g and %g", y.BetaFast, y.BetaSlow)
		case !(y.MScale >= 0) || !(y.MScaleAllDim >= 0) || math.IsInf(float64(y.MScale), 0) || math.IsInf(float64(y.MScaleAllDim), 0):
			return fmt.Errorf("model shape: yarn mscale and mscale_all_dim must be >= 0 and finite, got %g and %g", y.MScale, y.MScaleAllDim)
		}
	}
	return nil
}
