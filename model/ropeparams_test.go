package model

import (
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// transformers5 rewrites a config.json's RoPE fields as transformers 5
// saves them: rope_theta and rope_scaling become rope_parameters (with
// rope_type "default" when there was no scaling); with a local base
// (Gemma 3) one object per layer type.
func transformers5(c map[string]any) {
	params := map[string]any{"rope_type": "default"}
	if s, ok := c["rope_scaling"].(map[string]any); ok {
		for k, v := range s {
			params[k] = v
		}
		if t, ok := s["type"]; ok && s["rope_type"] == nil {
			params["rope_type"] = t
			delete(params, "type")
		}
	}
	if th, ok := c["rope_theta"]; ok {
		params["rope_theta"] = th
	}
	delete(c, "rope_theta")
	delete(c, "rope_scaling")
	c["rope_parameters"] = params
	if lb, ok := c["rope_local_base_freq"]; ok || c["model_type"] == "gemma3_text" {
		if !ok {
			lb = 10000.0
		}
		delete(c, "rope_local_base_freq")
		c["rope_parameters"] = map[string]any{"full_attention": params,
			"sliding_attention": map[string]any{"rope_type": "default", "rope_theta": lb}}
	}
}

// TestTransformers5RopeParameters: a config saved by transformers 5
// (rope_parameters, no rope_theta or rope_scaling) loads into the same
// shape as its 4.x form — a Llama with Llama-3 scaling and θ 500000, a
// Qwen2 with θ 10⁶, Phi-4-mini's LongRoPE, Gemma 3's per-layer-type
// bases and linear scaling — and contradictions are refused by name.
func TestTransformers5RopeParameters(t *testing.T) {
	llama := newTinyModel(61, false)
	llama.shape.RopeTheta = 500000
	llama.shape.RopeScaling = &bridge.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	qwen2 := withQKVBias(newTinyModel(62, true), 63)
	qwen2.shape.RopeTheta = 1e6
	qwen2cfg := func(c map[string]any) {
		c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"}
		delete(c, "attention_bias")
		delete(c, "mlp_bias")
	}
	phi := fused(newTinyModel(64, true))
	phicfg := func(c map[string]any) {
		c["model_type"], c["architectures"], c["sliding_window"] = "phi3", []string{"Phi3ForCausalLM"}, nil
		c["partial_rotary_factor"], c["original_max_position_embeddings"] = 0.75, 32
		c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": []float64{1, 2, 3, 4, 5, 6}, "short_factor": []float64{1, 1, 1, 1, 1, 1}}
	}
	gemma := gemmaTiny(65, 3)
	for _, c := range []struct {
		name string
		m    *tinyModel
		cfg  func(map[string]any)
		opts hfOptions
	}{
		{"llama3", llama, nil, hfOptions{}},
		{"qwen2", qwen2, qwen2cfg, hfOptions{}},
		{"phi3 longrope", phi, phicfg, hfOptions{}},
		{"gemma3", gemma, gemmaHFConfig(3), hfOptions{edit: gemmaHFNorms}},
	} {
		t.Run(c.name, func(t *testing.T) {
			old, o5 := c.opts, c.opts
			edit := c.cfg
			if edit == nil {
				edit = func(map[string]any) {}
			}
			old.config = edit
			o5.config = func(cfg map[string]any) { edit(cfg); transformers5(cfg) }
			a, b := loadOK(t, writeHF(t, c.m, old)), loadOK(t, writeHF(t, c.m, o5))
			requireSameModel(t, a, b)
			if c.name == "llama3" && (a.Shape.RopeTheta != 500000 || a.Shape.RopeScaling == nil) {
				t.Fatalf("llama3: shape %+v", a.Shape)
			}
		})
	}
	bad := func(edit func(map[string]any)) string {
		return writeHF(t, llama, hfOptions{config: func(c map[string]any) { transformers5(c); edit(c) }})
	}
	for _, c := range []struct{ name, path, want string }{
		{"two thetas", bad(func(c map[string]any) { c["rope_theta"] = 10000.0 }), "rope_theta 10000 and rope_parameters' rope_theta 500000 differ"},
		{"two scalings", bad(func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": 2.0} }), "a config has one"},
		{"unknown layer type", bad(func(c map[string]any) {
			c["rope_parameters"] = map[string]any{"full_attention": map[string]any{"rope_theta": 1e6}, "chunked_attention": map[string]any{}}
		}), `layer type "chunked_attention"`},
		{"negative theta", bad(func(c map[string]any) {
			c["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": -1.0}
		}), "rope_theta -1"},
	} {
		if _, err := Load(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
