package model

import (
	"math"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Phi-4-mini's form of Phi-3: partial RoPE (12 of 16 dimensions) and
// LongRoPE divisors with an attention factor, from GGUF (rope.dimension_count,
// rope_factors_long/short.weight, rope.scaling.attn_factor and
// original_context_length, as llama.cpp's converter writes them) and from
// a Hugging Face config (partial_rotary_factor, rope_scaling longrope): the
// same shape, weights and bit-identical runs; the long set serves a
// context longer than the original one, the short set one that is not;
// each part changes the logits.
func TestCrossFormatPhi3LongRoPE(t *testing.T) {
	long := []float32{1, 1.5, 2.25, 3.5, 5, 7.75}
	short := []float32{1, 1.03125, 1.0625, 1.125, 1.25, 1.375}
	orig := 32
	build := func(ctx int, partial, longrope bool) (string, string) {
		m := fused(newTinyModel(16, true))
		m.ctx = ctx
		attn := float32(math.Sqrt(1 + math.Log(float64(ctx)/float64(orig))/math.Log(float64(orig))))
		gm := *m
		if longrope {
			gm.tensors = append(append([]*tinyTensor(nil), m.tensors...),
				&tinyTensor{gguf: "rope_factors_long.weight", kind: bridge.WeightRopeFreqs, layer: -1, rows: 1, cols: len(long), data: long},
				&tinyTensor{gguf: "rope_factors_short.weight", kind: bridge.WeightRopeFreqs, layer: -1, rows: 1, cols: len(short), data: short})
		}
		gg := writeGGUF(t, &gm, ggufOptions{arch: "phi3", kvs: func(kvs []ggufKV) []ggufKV {
			var out []ggufKV
			for _, kv := range kvs {
				if kv.key != "phi3.rope.dimension_count" || !partial {
					out = append(out, kv)
				}
			}
			if partial {
				out = append(out, ggufKV{"phi3.rope.dimension_count", uint32(12)})
			}
			if longrope {
				out = append(out, ggufKV{"phi3.rope.scaling.attn_factor", attn}, ggufKV{"phi3.rope.scaling.original_context_length", uint32(orig)})
			}
			return out
		}})
		hf := writeHF(t, m, hfOptions{config: func(c map[string]any) {
			c["model_type"], c["architectures"], c["sliding_window"] = "phi3", []string{"Phi3ForCausalLM"}, nil
			if partial {
				c["partial_rotary_factor"] = 0.75
			}
			if longrope {
				c["original_max_position_embeddings"] = orig
				// (the config's attention factor: the float32 the GGUF has)
				c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": long, "short_factor": short, "attention_factor": float64(attn)}
			}
		}})
		return gg, hf
	}
	gg, hf := build(128, true, true)
	s := loadOK(t, gg).Shape
	if s.PartialRotaryDim != 12 || s.RopeAttnFactor == 0 || s.HeadDim != 16 {
		t.Fatalf("GGUF shape %+v: want partial_rotary_dim 12 of 16 and an attention factor", s)
	}
	full := crossCheck(t, gg, hf)
	var freqs []float32
	for k, v := range weightsOf(t, loadOK(t, gg)) {
		if k.kind == bridge.WeightRopeFreqs {
			freqs = v
		}
	}
	if len(freqs) != len(long) || freqs[5] != long[5] {
		t.Fatalf("a 128-position context over a 32-position original one reads the long divisors, got %v", freqs)
	}
	// A context no longer than the original: the short set, factor 1.
	ggs, hfs := build(orig, true, true)
	if s := loadOK(t, ggs).Shape; s.RopeAttnFactor != 0 {
		t.Fatalf("context = original: attention factor %v, want none", s.RopeAttnFactor)
	}
	crossCheck(t, ggs, hfs)
	if !haveEngine() {
		return
	}
	run := func(partial, longrope bool) engineRun {
		g, _ := build(128, partial, longrope)
		m := loadOK(t, g)
		return runEngine(t, m, crossPrompt(t, m))
	}
	partialOnly, whole := run(true, false), run(false, false)
	for _, c := range []struct {
		name string
		a, b engineRun
	}{{"LongRoPE", full, partialOnly}, {"partial RoPE", partialOnly, whole}} {
		same := true
		for i := range c.a.logits[0] {
			same = same && c.a.logits[0][i] == c.b.logits[0][i]
		}
		if same {
			t.Errorf("%s left the logits unchanged", c.name)
		}
	}
}

// LongRoPE's refusals name the setting.
func TestLongRoPERefusals(t *testing.T) {
	m := fused(newTinyModel(17, true))
	phi3 := func(edit func(map[string]any)) string {
		return writeHF(t, m, hfOptions{config: func(c map[string]any) {
			c["model_type"], c["architectures"], c["sliding_window"] = "phi3", []string{"Phi3ForCausalLM"}, nil
			edit(c)
		}})
	}
	for _, c := range []struct {
		name, path, want string
	}{
		{"odd partial", phi3(func(c map[string]any) { c["partial_rotary_factor"] = 0.3125 }), "partial_rotary_factor 0.3125"},
		{"factor count", phi3(func(c map[string]any) {
			c["original_max_position_embeddings"] = 32
			c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": []float64{1, 2}, "short_factor": []float64{1, 2}}
		}), "need 8 values each"},
		{"no original context", phi3(func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": make([]float64, 8), "short_factor": make([]float64, 8)}
		}), "needs original_max_position_embeddings"},
		{"zero factor", phi3(func(c map[string]any) {
			c["original_max_position_embeddings"] = 32
			c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": make([]float64, 8), "short_factor": make([]float64, 8)}
		}), "long_factor[0] = 0"},
		{"llama partial", writeHF(t, newTinyModel(17, true), hfOptions{config: func(c map[string]any) { c["partial_rotary_factor"] = 0.5 }}), "phi3 and glm4_moe only"},
	} {
		if _, err := Load(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
