package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// gemmaTiny makes a tiny Llama checkpoint a Gemma (version 1, 2 or 3) one:
// Gemma 2 and 3's tensor names for the MLP norm and the post norms (drawn
// as the other gains: 1 + k/128, so that a Hugging Face file's w = g - 1
// and 1 + w are exact), Gemma 3's q/k norms.
func gemmaTiny(seed int64, version int) *tinyModel {
	m := newTinyModel(seed, true)
	m.name = fmt.Sprintf("tiny-gemma%d", version)
	if version == 1 {
		return m
	}
	rng := rand.New(rand.NewSource(seed + 100))
	gain := func(n int) []float32 {
		d := make([]float32, n)
		for i := range d {
			d[i] = 1 + float32(rng.Intn(65)-32)/128
		}
		return d
	}
	H, D := m.shape.HiddenSize, m.shape.HeadDim
	var out []*tinyTensor
	for _, x := range m.tensors {
		if x.kind == bridge.WeightMLPNorm {
			x.hf = fmt.Sprintf("model.layers.%d.pre_feedforward_layernorm.weight", x.layer)
		}
		out = append(out, x)
		if x.kind != bridge.WeightO {
			continue
		}
		hp, gp := fmt.Sprintf("model.layers.%d.", x.layer), fmt.Sprintf("blk.%d.", x.layer)
		out = append(out,
			&tinyTensor{hf: hp + "post_attention_layernorm.weight", gguf: gp + "post_attention_norm.weight", kind: bridge.WeightAttnPostNorm, layer: x.layer, rows: 1, cols: H, data: gain(H)},
			&tinyTensor{hf: hp + "post_feedforward_layernorm.weight", gguf: gp + "post_ffw_norm.weight", kind: bridge.WeightMLPPostNorm, layer: x.layer, rows: 1, cols: H, data: gain(H)})
		if version == 3 {
			out = append(out,
				&tinyTensor{hf: hp + "self_attn.q_norm.weight", gguf: gp + "attn_q_norm.weight", kind: bridge.WeightQNorm, layer: x.layer, rows: 1, cols: D, data: gain(D)},
				&tinyTensor{hf: hp + "self_attn.k_norm.weight", gguf: gp + "attn_k_norm.weight", kind: bridge.WeightKNorm, layer: x.layer, rows: 1, cols: D, data: gain(D)})
		}
	}
	m.tensors = out
	return m
}

// gemmaHFNorms stores every RMSNorm gain g of a Hugging Face shard as Gemma
// does, w = g - 1 (F32 shards).
func gemmaHFNorms(_ int, ts []stTensor) []stTensor {
	for i, x := range ts {
		if !strings.Contains(x.name, "norm") {
			continue
		}
		data := append([]byte(nil), x.data...)
		for j := 0; j < len(data); j += 4 {
			g := math.Float32frombits(binary.LittleEndian.Uint32(data[j:]))
			binary.LittleEndian.PutUint32(data[j:], math.Float32bits(g-1))
		}
		ts[i].data = data
	}
	return ts
}

// gemmaHFConfig sets a Gemma config.json (version 1, 2 or 3: model_type
// gemma, gemma2, gemma3_text) with the test's window, caps and RoPE.
func gemmaHFConfig(version int) func(map[string]any) {
	return func(c map[string]any) {
		c["model_type"] = map[int]string{1: "gemma", 2: "gemma2", 3: "gemma3_text"}[version]
		c["architectures"] = []string{map[int]string{1: "GemmaForCausalLM", 2: "Gemma2ForCausalLM", 3: "Gemma3ForCausalLM"}[version]}
		c["hidden_act"], c["hidden_activation"], c["query_pre_attn_scalar"] = "gelu_pytorch_tanh", "gelu_pytorch_tanh", 16
		switch version {
		case 2:
			c["attn_logit_softcapping"], c["final_logit_softcapping"], c["sliding_window"] = 5.0, 10.0, 8
			c["layer_types"] = []string{"sliding_attention", "full_attention"}
		case 3:
			c["sliding_window"], c["rope_scaling"] = 8, map[string]any{"rope_type": "linear", "factor": 8.0}
			c["attn_logit_softcapping"], c["final_logit_softcapping"] = nil, nil
		}
	}
}

// gemmaGGUFKeys adds the same settings as GGUF metadata (llama.cpp's keys
// and defaults: Gemma 3's pattern 6 and local base 10000 unwritten).
func gemmaGGUFKeys(version int) func([]ggufKV) []ggufKV {
	return func(kvs []ggufKV) []ggufKV {
		arch := map[int]string{1: "gemma", 2: "gemma2", 3: "gemma3"}[version]
		switch version {
		case 2:
			kvs = append(kvs, ggufKV{arch + ".attention.sliding_window", uint32(8)}, ggufKV{arch + ".attn_logit_softcapping", float32(5)},
				ggufKV{arch + ".final_logit_softcapping", float32(10)})
		case 3:
			kvs = append(kvs, ggufKV{arch + ".attention.sliding_window", uint32(8)}, ggufKV{arch + ".rope.scaling.type", "linear"},
				ggufKV{arch + ".rope.scaling.factor", float32(8)})
		}
		return kvs
	}
}

// TestCrossFormatGemma: Gemma 1, 2 and 3 checkpoints load from GGUF
// (general.architecture gemma, gemma2, gemma3: norm gains stored as 1 + w)
// and from Hugging Face directories (model_type gemma, gemma2,
// gemma3_text: w, post_attention_layernorm meaning the attention output's
// norm in 2 and 3) into the same shape and weights, and run bit-identically.
func TestCrossFormatGemma(t *testing.T) {
	want := map[int]bridge.ModelShape{
		1: {MLPGelu: true},
		2: {MLPGelu: true, PostNorms: true, AttnSoftcap: 5, FinalSoftcap: 10, SlidingWindow: 8, SlidingWindowPattern: 2},
		3: {MLPGelu: true, PostNorms: true, QKNorm: true, SlidingWindow: 8, SlidingWindowPattern: 6, RopeLocalTheta: 10000, RopeLinearFactor: 8},
	}
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			m := gemmaTiny(31+int64(version), version)
			arch := map[int]string{1: "gemma", 2: "gemma2", 3: "gemma3"}[version]
			gg := writeGGUF(t, m, ggufOptions{arch: arch, kvs: gemmaGGUFKeys(version)})
			hf := writeHF(t, m, hfOptions{config: gemmaHFConfig(version), edit: gemmaHFNorms})
			s := loadOK(t, gg).Shape
			w := want[version]
			got := bridge.ModelShape{MLPGelu: s.MLPGelu, PostNorms: s.PostNorms, QKNorm: s.QKNorm, AttnSoftcap: s.AttnSoftcap,
				FinalSoftcap: s.FinalSoftcap, SlidingWindow: s.SlidingWindow, SlidingWindowPattern: s.SlidingWindowPattern,
				RopeLocalTheta: s.RopeLocalTheta, RopeLinearFactor: s.RopeLinearFactor}
			if got != w || s.EmbeddingScale != 8 || s.AttentionScale != 0 {
				t.Fatalf("GGUF shape %+v, want Gemma's fields %+v, embedding scale 8", s, w)
			}
			crossCheck(t, gg, hf)
		})
	}
}

// TestGemmaRefusals: what the engine does not compute is refused at load,
// naming the setting.
func TestGemmaRefusals(t *testing.T) {
	m2, m3 := gemmaTiny(41, 2), gemmaTiny(42, 3)
	hf := func(m *tinyModel, version int, edit func(map[string]any)) string {
		return writeHF(t, m, hfOptions{config: func(c map[string]any) { gemmaHFConfig(version)(c); edit(c) }, edit: gemmaHFNorms})
	}
	gg := func(m *tinyModel, version int, extra ...ggufKV) string {
		return writeGGUF(t, m, ggufOptions{arch: map[int]string{2: "gemma2", 3: "gemma3"}[version], kvs: func(kvs []ggufKV) []ggufKV {
			return append(gemmaGGUFKeys(version)(kvs), extra...)
		}})
	}
	for _, c := range []struct {
		name, path, want string
	}{
		{"erf GELU", hf(m2, 2, func(c map[string]any) { c["hidden_activation"] = "gelu_new" }), `hidden_activation "gelu_new"`},
		{"irregular layer types", hf(m3, 3, func(c map[string]any) { c["layer_types"] = []string{"full_attention", "sliding_attention"} }), "layer_types"},
		{"unknown layer type", hf(m3, 3, func(c map[string]any) { c["layer_types"] = []string{"chunked_attention", "full_attention"} }), `"chunked_attention"`},
		{"negative cap", hf(m2, 2, func(c map[string]any) { c["final_logit_softcapping"] = -1.0 }), "final_logit_softcapping -1"},
		{"linear RoPE with windows on gemma2", gg(m2, 2, ggufKV{"gemma2.rope.scaling.type", "linear"}, ggufKV{"gemma2.rope.scaling.factor", float32(4)}),
			"linear RoPE scaling of a gemma2 model with sliding-window layers"},
		{"irregular GGUF pattern", gg(m3, 3, ggufKV{"gemma3.attention.sliding_window_pattern", []bool{false, true}}), "sliding_window_pattern gives sliding layers [false true]"},
		{"GGUF pattern array length", gg(m3, 3, ggufKV{"gemma3.attention.sliding_window_pattern", []bool{true}}), "want one bool per layer"},
	} {
		if _, err := Load(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	// A pattern array llama.cpp's set_swa_pattern(2) would make is read as 2.
	if s := loadOK(t, gg(m3, 3, ggufKV{"gemma3.attention.sliding_window_pattern", []bool{true, false}})).Shape; s.SlidingWindowPattern != 2 || s.SlidingWindow != 8 {
		t.Errorf("pattern array [true false]: shape %+v", s)
	}
	// No layer slides: no window.
	if s := loadOK(t, gg(m3, 3, ggufKV{"gemma3.attention.sliding_window_pattern", uint32(1)})).Shape; s.SlidingWindow != 0 || s.RopeLocalTheta != 0 {
		t.Errorf("pattern 1: shape %+v", s)
	}
}

// TestMistralSlidingWindow: Mistral 7B v0.1's sliding window (every layer,
// shorter than the context) loads as a window on every layer and changes
// the logits of a sequence longer than it; one as long as the context is
// no window.
func TestMistralSlidingWindow(t *testing.T) {
	m := newTinyModel(51, false)
	mistral := func(w int) hfOptions {
		return hfOptions{config: func(c map[string]any) { c["model_type"], c["sliding_window"] = "mistral", w }}
	}
	win := loadOK(t, writeHF(t, m, mistral(8)))
	if s := win.Shape; s.SlidingWindow != 8 || s.SlidingWindowPattern != 0 {
		t.Fatalf("sliding_window 8: shape %+v", s)
	}
	full := loadOK(t, writeHF(t, m, mistral(m.ctx)))
	if s := full.Shape; s.SlidingWindow != 0 {
		t.Fatalf("sliding_window = max_position_embeddings: shape %+v", s)
	}
	if !haveEngine() {
		return
	}
	prompt := crossPrompt(t, win)
	a, b := runEngine(t, win, prompt), runEngine(t, full, prompt)
	same := true
	for i := range a.logits[0] {
		same = same && a.logits[0][i] == b.logits[0][i]
	}
	if same {
		t.Fatalf("a window of 8 over a %d-token prompt left the logits unchanged", len(prompt))
	}
}

// gemma3Multimodal nests a gemma3_text config as a Gemma 3 image-text
// checkpoint's (model_type gemma3, the text decoder's fields in
// text_config) and renames its tensors language_model.model.* (prefix),
// adding a vision tower's tensor.
func gemma3Multimodal(prefix string) (func(map[string]any), func(int, []stTensor) []stTensor) {
	config := func(c map[string]any) {
		gemmaHFConfig(3)(c)
		text := map[string]any{}
		for k, v := range c {
			text[k] = v
		}
		for k := range c {
			delete(c, k)
		}
		c["model_type"], c["architectures"], c["_name_or_path"] = "gemma3", []string{"Gemma3ForConditionalGeneration"}, text["_name_or_path"]
		c["text_config"], c["vision_config"] = text, map[string]any{"model_type": "siglip_vision_model", "hidden_size": 8}
	}
	edit := func(shard int, ts []stTensor) []stTensor {
		ts = gemmaHFNorms(shard, ts)
		for i := range ts {
			ts[i].name = prefix + strings.TrimPrefix(ts[i].name, "model.")
		}
		if shard == 0 {
			ts = append(ts, stTensor{name: "vision_tower.vision_model.post_layernorm.weight", dtype: "F32", shape: []int{2}, data: make([]byte, 8)})
		}
		return ts
	}
	return config, edit
}

// TestGemma3Multimodal: Gemma 3 4B/12B/27B's image-text checkpoints
// (Gemma3ForConditionalGeneration) load their text decoder — the same
// model, bit for bit, as the text-only form — under either prefix
// transformers has saved (language_model.model.*, model.language_model.*),
// the vision tower skipped; text_config's missing fields take
// Gemma3TextConfig's defaults.
func TestGemma3Multimodal(t *testing.T) {
	m := gemmaTiny(71, 3)
	text := writeHF(t, m, hfOptions{config: gemmaHFConfig(3), edit: gemmaHFNorms})
	for _, prefix := range []string{"language_model.model.", "model.language_model."} {
		cfg, edit := gemma3Multimodal(prefix)
		crossCheck(t, text, writeHF(t, m, hfOptions{config: cfg, edit: edit}))
	}
	// Without head_dim, text_config says Gemma's default 256, which these
	// 16-wide heads' tensors are not.
	cfg, edit := gemma3Multimodal("language_model.model.")
	sparse := writeHF(t, m, hfOptions{edit: edit, config: func(c map[string]any) {
		cfg(c)
		delete(c["text_config"].(map[string]any), "head_dim")
	}})
	if _, err := Load(sparse); err == nil || !strings.Contains(err.Error(), "q_proj") {
		t.Fatalf("text_config without head_dim: %v, want the q projection's shape refused (default head_dim 256)", err)
	}
}
