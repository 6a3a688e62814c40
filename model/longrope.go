package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/lockstep-ai/lockstep/bridge"
)

// LongRoPE (Phi-3 mini 128k, Phi-3.5, Phi-4-mini): per-dimension divisors
// of the RoPE frequencies, one set for contexts past the first training
// context and one for shorter ones, and an attention factor on cos and
// sin. llama.cpp picks the set by the context it serves; this loader serves
// the model's whole context, so the long set whenever that context is
// longer than original_max_position_embeddings. (transformers picks by the
// current sequence's length, vLLM by the longest position in the batch:
// they differ from this on prompts shorter than the first context.)

// hfLongRoPE reads a phi3 config's rope_scaling of type longrope (or its
// older name su) into s and c.ropeFactors.
func hfLongRoPE(c *hfModelConfig, s *bridge.ModelShape) error {
	var r struct {
		Long      []float64 `json:"long_factor"`
		Short     []float64 `json:"short_factor"`
		Attention *float64  `json:"attention_factor"`
		Original  int       `json:"original_max_position_embeddings"`
	}
	if err := json.Unmarshal(c.RopeScaling, &r); err != nil {
		return fmt.Errorf("rope_scaling: %v", err)
	}
	if c.ModelType != "phi3" {
		return fmt.Errorf("rope_scaling type \"longrope\" is supported for phi3 only")
	}
	orig := r.Original
	if orig == 0 {
		orig = c.OriginalMaxPositionEmbeddings
	}
	if orig <= 0 || c.MaxPositionEmbeddings <= 0 {
		return fmt.Errorf("rope_scaling longrope needs original_max_position_embeddings and max_position_embeddings, got %d and %d", orig, c.MaxPositionEmbeddings)
	}
	half := s.RopeDim() / 2
	if len(r.Long) != half || len(r.Short) != half {
		return fmt.Errorf("rope_scaling longrope: long_factor and short_factor need %d values each (half the rotated dimensions), got %d and %d", half, len(r.Long), len(r.Short))
	}
	scale := float64(c.MaxPositionEmbeddings) / float64(orig)
	factors, set := r.Short, "short"
	if scale > 1 {
		factors, set = r.Long, "long"
	}
	attn := 1.0
	if scale > 1 {
		attn = math.Sqrt(1 + math.Log(scale)/math.Log(float64(orig)))
	}
	if r.Attention != nil {
		attn = *r.Attention
	}
	if !(attn > 0) || math.IsInf(attn, 0) {
		return fmt.Errorf("rope_scaling longrope: attention factor %v is not a positive number", attn)
	}
	if attn != 1 {
		s.RopeAttnFactor = float32(attn)
	}
	data := make([]byte, 4*half)
	for i, f := range factors {
		if !(f > 0) || math.IsInf(f, 0) {
			return fmt.Errorf("rope_scaling longrope: %s_factor[%d] = %v is not a positive number", set, i, f)
		}
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(f)))
	}
	c.ropeFactors = &bridge.WeightTensor{Name: "config.json rope_scaling." + set + "_factor", Kind: bridge.WeightRopeFreqs,
		Layer: -1, DType: bridge.DTypeF32, Rows: 1, Cols: int64(half), Data: data}
	return nil
}

// hfPartialRotary reads partial_rotary_factor (Phi-4-mini's 0.75) into s:
// the rotated dimensions of each head, int(head_dim × factor), as
// transformers computes them.
func hfPartialRotary(c *hfModelConfig, s *bridge.ModelShape) error {
	if c.PartialRotary == nil || *c.PartialRotary == 1 {
		return nil
	}
	f := *c.PartialRotary
	if c.ModelType != "phi3" && c.ModelType != "glm4_moe" {
		return fmt.Errorf("partial_rotary_factor %v: partial RoPE is supported for phi3 and glm4_moe only", f)
	}
	dim := int(float64(s.HeadDim) * f)
	if !(f > 0 && f < 1) || dim < 2 || dim%2 != 0 {
		return fmt.Errorf("partial_rotary_factor %v of head_dim %d does not give an even rotated part", f, s.HeadDim)
	}
	s.PartialRotaryDim = dim
	return nil
}
