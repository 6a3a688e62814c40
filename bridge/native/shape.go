//go:build native

package native

/*
#cgo CFLAGS: -I${SRCDIR}/../../native/include
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"math"

	"github.com/lockstep-ai/lockstep/bridge"
)

// The model shape across the C ABI (eng_model_shape), both ways.

// setInt32 stores v in *dst or reports that the field does not fit.
func setInt32(dst *C.int32_t, op, field string, v int) error {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return bridge.StatusError(op, bridge.StatusInvalidArgument,
			fmt.Sprintf("%s = %d is out of the int32 range", field, v))
	}
	*dst = C.int32_t(v)
	return nil
}

func shapeToC(s *bridge.ModelShape, c *C.eng_model_shape) error {
	ints := []struct {
		field string
		v     int
		dst   *C.int32_t
	}{
		{"NumLayers", s.NumLayers, &c.num_layers},
		{"HiddenSize", s.HiddenSize, &c.hidden_size},
		{"NumHeads", s.NumHeads, &c.num_heads},
		{"NumKVHeads", s.NumKVHeads, &c.num_kv_heads},
		{"HeadDim", s.HeadDim, &c.head_dim},
		{"IntermediateSize", s.IntermediateSize, &c.intermediate_size},
		{"VocabSize", s.VocabSize, &c.vocab_size},
		{"NumExperts", s.NumExperts, &c.num_experts},
		{"NumExpertsPerTok", s.NumExpertsPerTok, &c.num_experts_per_tok},
		{"MoEIntermediateSize", s.MoEIntermediateSize, &c.moe_intermediate_size},
		{"NumSharedExperts", s.NumSharedExperts, &c.num_shared_experts},
		{"RouterNorm", int(s.RouterNorm), &c.router_norm},
		{"QLoraRank", s.QLoraRank, &c.q_lora_rank},
		{"KVLoraRank", s.KVLoraRank, &c.kv_lora_rank},
		{"QKNopeHeadDim", s.QKNopeHeadDim, &c.qk_nope_head_dim},
		{"QKRopeHeadDim", s.QKRopeHeadDim, &c.qk_rope_head_dim},
		{"VHeadDim", s.VHeadDim, &c.v_head_dim},
		{"FirstDenseLayers", s.FirstDenseLayers, &c.first_dense_layers},
		{"ExpertGroups", s.ExpertGroups, &c.expert_groups},
		{"ExpertGroupsUsed", s.ExpertGroupsUsed, &c.expert_groups_used},
	}
	for _, f := range ints {
		if err := setInt32(f.dst, "init", "Shape."+f.field, f.v); err != nil {
			return err
		}
	}
	c.rope_theta = C.float(s.RopeTheta)
	c.rms_eps = C.float(s.RMSEps)
	if r := s.RopeScaling; r != nil {
		c.rope_scaling_factor = C.float(r.Factor)
		c.rope_low_freq_factor = C.float(r.LowFreqFactor)
		c.rope_high_freq_factor = C.float(r.HighFreqFactor)
		if err := setInt32(&c.rope_original_max_positions, "init", "Shape.RopeScaling.OriginalMaxPositions", r.OriginalMaxPositions); err != nil {
			return err
		}
	}
	c.routed_scaling_factor = C.float(s.RoutedScalingFactor)
	if y := s.Yarn; y != nil {
		c.yarn_factor = C.float(y.Factor)
		if err := setInt32(&c.yarn_original_max_positions, "init", "Shape.Yarn.OriginalMaxPositions", y.OriginalMaxPositions); err != nil {
			return err
		}
		c.yarn_beta_fast, c.yarn_beta_slow = C.float(y.BetaFast), C.float(y.BetaSlow)
		c.yarn_mscale, c.yarn_mscale_all_dim = C.float(y.MScale), C.float(y.MScaleAllDim)
	}
	if s.TiedEmbeddings {
		c.tied_embeddings = 1
	}
	if s.QKNorm {
		c.qk_norm = 1
	}
	if s.QKVBias {
		c.qkv_bias = 1
	}
	c.embedding_scale, c.residual_scale = C.float(s.EmbeddingScale), C.float(s.ResidualScale)
	c.attention_scale, c.logit_scale = C.float(s.AttentionScale), C.float(s.LogitScale)
	if s.MLPGelu {
		c.mlp_gelu = 1
	}
	if s.PostNorms {
		c.post_norms = 1
	}
	c.attn_softcap, c.final_softcap = C.float(s.AttnSoftcap), C.float(s.FinalSoftcap)
	c.sliding_window, c.sliding_window_pattern = C.int32_t(s.SlidingWindow), C.int32_t(s.SlidingWindowPattern)
	c.rope_local_theta, c.rope_linear_factor = C.float(s.RopeLocalTheta), C.float(s.RopeLinearFactor)
	c.partial_rotary_dim, c.rope_attn_factor = C.int32_t(s.PartialRotaryDim), C.float(s.RopeAttnFactor)
	return nil
}

func shapeFromC(c *C.eng_model_shape) bridge.ModelShape {
	s := bridge.ModelShape{
		NumLayers:        int(c.num_layers),
		HiddenSize:       int(c.hidden_size),
		NumHeads:         int(c.num_heads),
		NumKVHeads:       int(c.num_kv_heads),
		HeadDim:          int(c.head_dim),
		IntermediateSize: int(c.intermediate_size),
		VocabSize:        int(c.vocab_size),
		RopeTheta:        float32(c.rope_theta),
		RMSEps:           float32(c.rms_eps),
		TiedEmbeddings:   c.tied_embeddings != 0,

		NumExperts:           int(c.num_experts),
		NumExpertsPerTok:     int(c.num_experts_per_tok),
		MoEIntermediateSize:  int(c.moe_intermediate_size),
		NumSharedExperts:     int(c.num_shared_experts),
		RouterNorm:           bridge.RouterNorm(c.router_norm),
		QKNorm:               c.qk_norm != 0,
		QKVBias:              c.qkv_bias != 0,
		EmbeddingScale:       float32(c.embedding_scale),
		ResidualScale:        float32(c.residual_scale),
		AttentionScale:       float32(c.attention_scale),
		LogitScale:           float32(c.logit_scale),
		MLPGelu:              c.mlp_gelu != 0,
		PostNorms:            c.post_norms != 0,
		AttnSoftcap:          float32(c.attn_softcap),
		FinalSoftcap:         float32(c.final_softcap),
		SlidingWindow:        int(c.sliding_window),
		SlidingWindowPattern: int(c.sliding_window_pattern),
		RopeLocalTheta:       float32(c.rope_local_theta),
		RopeLinearFactor:     float32(c.rope_linear_factor),
		PartialRotaryDim:     int(c.partial_rotary_dim),
		RopeAttnFactor:       float32(c.rope_attn_factor),

		QLoraRank:           int(c.q_lora_rank),
		KVLoraRank:          int(c.kv_lora_rank),
		QKNopeHeadDim:       int(c.qk_nope_head_dim),
		QKRopeHeadDim:       int(c.qk_rope_head_dim),
		VHeadDim:            int(c.v_head_dim),
		FirstDenseLayers:    int(c.first_dense_layers),
		RoutedScalingFactor: float32(c.routed_scaling_factor),
		ExpertGroups:        int(c.expert_groups),
		ExpertGroupsUsed:    int(c.expert_groups_used),
	}
	if c.yarn_factor != 0 {
		s.Yarn = &bridge.YarnScaling{Factor: float32(c.yarn_factor), OriginalMaxPositions: int(c.yarn_original_max_positions),
			BetaFast: float32(c.yarn_beta_fast), BetaSlow: float32(c.yarn_beta_slow),
			MScale: float32(c.yarn_mscale), MScaleAllDim: float32(c.yarn_mscale_all_dim)}
	}
	if c.rope_scaling_factor != 0 {
		s.RopeScaling = &bridge.RopeScaling{
			Factor:               float32(c.rope_scaling_factor),
			LowFreqFactor:        float32(c.rope_low_freq_factor),
			HighFreqFactor:       float32(c.rope_high_freq_factor),
			OriginalMaxPositions: int(c.rope_original_max_positions),
		}
	}
	return s
}
