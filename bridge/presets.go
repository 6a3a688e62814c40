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
	case s.RouterNorm != RouterSoftmaxTopK && s.RouterNorm != RouterTopKSoftmax:
		return fmt.Errorf("model shape: router_norm must be 0 (softmax, top-k, renormalise) or 1 (top-k, softmax), got %d", s.RouterNorm)
	}
	return nil
}
