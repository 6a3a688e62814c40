package model

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// writeGlmHF writes a loaded glm4moe GGUF model as a Hugging Face glm4_moe
// directory (F32, one shard), with one multi-token-prediction layer's
// tensors after its layers (random-free: zeros), and returns it.
func writeGlmHF(t *testing.T, m *Model, edits ...func(cfg map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	s := m.Shape
	cfg := map[string]any{
		"_name_or_path": m.Name, "architectures": []string{"Glm4MoeForCausalLM"}, "model_type": "glm4_moe",
		"hidden_size": s.HiddenSize, "intermediate_size": s.IntermediateSize, "num_hidden_layers": s.NumLayers,
		"num_attention_heads": s.NumHeads, "num_key_value_heads": s.NumKVHeads, "head_dim": s.HeadDim,
		"partial_rotary_factor": float64(s.PartialRotaryDim) / float64(s.HeadDim), "vocab_size": s.VocabSize,
		"rope_theta": float64(s.RopeTheta), "rms_norm_eps": float64(s.RMSEps), "tie_word_embeddings": s.TiedEmbeddings,
		"max_position_embeddings": m.ContextLength, "hidden_act": "silu", "attention_bias": s.QKVBias, "use_qk_norm": s.QKNorm,
		"first_k_dense_replace": s.FirstDenseLayers, "n_routed_experts": s.NumExperts, "n_shared_experts": s.NumSharedExperts,
		"num_experts_per_tok": s.NumExpertsPerTok, "moe_intermediate_size": s.MoEIntermediateSize,
		"routed_scaling_factor": float64(s.RoutedScalingFactor), "norm_topk_prob": s.RouterNorm == bridge.RouterSigmoidTopK,
		"n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 1, "rope_scaling": nil,
	}
	for _, e := range edits {
		e(cfg)
	}
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)
	f32 := func(w bridge.WeightTensor) []float32 { return f32Values(t, w) }
	var ts []stTensor
	add := func(name string, rows, cols int64, data []float32) { ts = append(ts, stF32(t, name, rows, cols, data)) }
	names := map[bridge.WeightKind]string{
		bridge.WeightAttnNorm: "input_layernorm.weight", bridge.WeightMLPNorm: "post_attention_layernorm.weight",
		bridge.WeightQ: "self_attn.q_proj.weight", bridge.WeightK: "self_attn.k_proj.weight", bridge.WeightV: "self_attn.v_proj.weight",
		bridge.WeightQBias: "self_attn.q_proj.bias", bridge.WeightKBias: "self_attn.k_proj.bias", bridge.WeightVBias: "self_attn.v_proj.bias",
		bridge.WeightQNorm: "self_attn.q_norm.weight", bridge.WeightKNorm: "self_attn.k_norm.weight",
		bridge.WeightO: "self_attn.o_proj.weight", bridge.WeightGate: "mlp.gate_proj.weight", bridge.WeightUp: "mlp.up_proj.weight",
		bridge.WeightDown: "mlp.down_proj.weight", bridge.WeightRouter: "mlp.gate.weight", bridge.WeightRouterBias: "mlp.gate.e_score_correction_bias",
		bridge.WeightSharedGate: "mlp.shared_experts.gate_proj.weight", bridge.WeightSharedUp: "mlp.shared_experts.up_proj.weight",
		bridge.WeightSharedDown: "mlp.shared_experts.down_proj.weight",
	}
	for _, w := range m.Tensors {
		lp := fmt.Sprintf("model.layers.%d.", w.Layer)
		switch {
		case w.Kind == bridge.WeightEmbedding:
			add("model.embed_tokens.weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightFinalNorm:
			add("model.norm.weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightLMHead:
			add("lm_head.weight", w.Rows, w.Cols, f32(w))
		case w.Kind.IsExpert():
			part := map[bridge.WeightKind]string{bridge.WeightExpertGate: "gate_proj", bridge.WeightExpertUp: "up_proj", bridge.WeightExpertDown: "down_proj"}[w.Kind]
			add(fmt.Sprintf("%smlp.experts.%d.%s.weight", lp, w.Expert, part), w.Rows, w.Cols, f32(w))
		default:
			n, ok := names[w.Kind]
			if !ok {
				t.Fatalf("%s: no Hugging Face name for kind %d", w.Name, w.Kind)
			}
			add(lp+n, w.Rows, w.Cols, f32(w))
		}
	}
	// The multi-token-prediction layer (num_nextn_predict_layers 1).
	mtp := fmt.Sprintf("model.layers.%d.", s.NumLayers)
	H := int64(s.HiddenSize)
	add(mtp+"eh_proj.weight", H, 2*H, make([]float32, 2*H*H))
	add(mtp+"enorm.weight", 1, H, make([]float32, H))
	add(mtp+"input_layernorm.weight", 1, H, make([]float32, H))
	writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
	sp := m.Tokenizer.Spec()
	writeHFTokenizer(t, dir, &tinyModel{tokens: sp.Tokens, types: sp.TokenTypes, merges: sp.Merges, bos: sp.BOS, eos: sp.EOS,
		addBOS: sp.AddBOS, tmpl: sp.ChatTemplate})
	return dir
}

// TestCrossFormatGlm4Moe: GLM-4.5's form (llama.cpp's glm4moe GGUF, with its
// multi-token-prediction layer counted in block_count; Hugging Face's
// glm4_moe with num_nextn_predict_layers) loads into one shape and the
// same weights from both and runs bit-identically: q/k/v biases, half
// of each head turned, a sigmoid router with its correction bias, a
// shared expert and a leading dense layer, the MTP layer skipped.
func TestCrossFormatGlm4Moe(t *testing.T) {
	gg := filepath.Join("..", "tests", "testdata", "moe", "glm4moe.gguf")
	m := loadOK(t, gg)
	s := m.Shape
	if s.NumLayers != 2 || !s.QKVBias || s.QKNorm || s.PartialRotaryDim != 8 || s.HeadDim != 16 ||
		s.RouterNorm != bridge.RouterSigmoidTopK || s.NumSharedExperts != 1 || s.FirstDenseLayers != 1 || s.RoutedScalingFactor != 2.5 {
		t.Fatalf("glm4moe shape %+v", s)
	}
	hf := loadOK(t, writeGlmHF(t, m))
	requireSameModel(t, m, hf)
	if haveEngine() {
		prompt := m.Tokenizer.Encode("The capital of France is", EncodeOptions{})
		requireSameRun(t, runEngine(t, m, prompt), runEngine(t, hf, prompt))
	}
	for _, c := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"MTP layer not declared", func(c map[string]any) { c["num_nextn_predict_layers"] = 0 }, "is not part of a glm4_moe decoder"},
		{"odd partial rotation", func(c map[string]any) { c["partial_rotary_factor"] = 0.3125 }, "partial_rotary_factor 0.3125"},
	} {
		if _, err := Load(writeGlmHF(t, m, c.edit)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// GLM's GGUF pre-tokenisers (llama.cpp's glm4/glm5, CHATGLM4's regex: Llama
// 3's, with the contractions spelled out in ASCII) split the fixture's
// 1 154 texts as llama-bpe does (the `tokenizers` library splits them so
// too with CHATGLM4's regex), and their vocabularies have no BOS, as
// llama.cpp gives them none, whatever the file says.
func TestGlmPreTokenizer(t *testing.T) {
	k, err := lookupPre("glm4")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range readJSONL[pretokCase](t, "testdata/pretok_cases.jsonl") {
		if c.Pre != "llama-bpe" {
			continue
		}
		var got []string
		k.split(c.Text, func(s string) { got = append(got, s) })
		if strings.Join(got, "\x00") != strings.Join(c.Pieces, "\x00") {
			t.Fatalf("glm4 %q: %q, want %q", c.Text, got, c.Pieces)
		}
		n++
	}
	if n != 1154 {
		t.Fatalf("%d llama-bpe cases", n)
	}
	m := newTinyModel(81, true)
	m.addBOS = true
	tok := loadOK(t, writeGGUF(t, m, ggufOptions{kvs: func(kvs []ggufKV) []ggufKV {
		for i := range kvs {
			if kvs[i].key == "tokenizer.ggml.pre" {
				kvs[i].val = "glm4"
			}
		}
		return kvs
	}})).Tokenizer
	if tok.BOS() != -1 || len(tok.Encode("hi", EncodeOptions{AddSpecial: true})) != len(tok.Encode("hi", EncodeOptions{})) {
		t.Fatalf("a glm4 vocabulary has BOS %d", tok.BOS())
	}
}
