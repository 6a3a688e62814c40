package model

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
)

// GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7 (Hugging Face glm4_moe, GGUF
// glm4moe): DeepSeek-V3's mixture of experts (a sigmoid router with a
// score-correction bias, shared experts, leading dense layers, routed
// scaling) under GQA attention with q/k/v biases, optional per-head q/k
// norms and NeoX RoPE over the first half of each head (partial rotary).
// Their multi-token-prediction layers (num_nextn_predict_layers, counted
// in GGUF's block_count) serve speculative decoding, which lockstep does
// not run: the loaders skip them.

// hfGlm4MoeShape reads a glm4_moe config's own fields into s.
func hfGlm4MoeShape(c *hfModelConfig, s *bridge.ModelShape) error {
	if c.HeadDim != 0 {
		s.HeadDim = c.HeadDim
	}
	s.QKVBias, s.QKNorm = c.AttentionBias, c.UseQKNorm
	if c.PartialRotary == nil {
		half := 0.5 // transformers' Glm4MoeConfig default
		c.PartialRotary = &half
	}
	if err := hfPartialRotary(c, s); err != nil {
		return err
	}
	if c.ScoringFunc == "" {
		c.ScoringFunc = "sigmoid"
	}
	if c.TopKMethod == "" {
		c.TopKMethod = "noaux_tc"
	}
	if c.NumNextnPredictLayers < 0 {
		return fmt.Errorf("num_nextn_predict_layers %d is negative", c.NumNextnPredictLayers)
	}
	return hfDeepSeekMoE(c, s)
}
