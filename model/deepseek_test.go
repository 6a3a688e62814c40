package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
)

// deepseekFiles are the random-weight deepseek2 checkpoints of
// tests/testdata/moe (scripts/reference/make_moe_reference.py).
var deepseekFiles = []string{"deepseek2", "deepseek2-lite", "deepseek2-yarn"}

func deepseekPath(name string) string {
	return filepath.Join("..", "tests", "testdata", "moe", name+".gguf")
}

// TestGGUFDeepSeekLoads: the deepseek2 files' shapes as llama.cpp reads
// them (scripts/reference/README.md, "DeepSeek (MLA) checkpoints").
func TestGGUFDeepSeekLoads(t *testing.T) {
	for _, c := range []struct {
		name string
		want func(s *bridge.ModelShape)
	}{
		{"deepseek2", func(s *bridge.ModelShape) {}},
		{"deepseek2-lite", func(s *bridge.ModelShape) {
			s.NumLayers, s.QLoraRank, s.VHeadDim = 2, 0, 16
			s.NumExperts, s.NumExpertsPerTok, s.NumSharedExperts = 8, 2, 2
			s.RouterNorm, s.RoutedScalingFactor, s.ExpertGroups, s.ExpertGroupsUsed = bridge.RouterSoftmaxTopKRaw, 1, 0, 0
		}},
		{"deepseek2-yarn", func(s *bridge.ModelShape) {
			s.Yarn = &bridge.YarnScaling{Factor: 4, OriginalMaxPositions: 32, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 1}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := loadOK(t, deepseekPath(c.name))
			want := bridge.ModelShape{NumLayers: 3, HiddenSize: 32, NumHeads: 4, NumKVHeads: 4, HeadDim: 16,
				IntermediateSize: 64, VocabSize: 263, RopeTheta: 10000, RMSEps: 1e-6,
				NumExperts: 16, NumExpertsPerTok: 4, MoEIntermediateSize: 8, NumSharedExperts: 1,
				RouterNorm: bridge.RouterSigmoidTopK, QLoraRank: 16, KVLoraRank: 16, QKNopeHeadDim: 8, QKRopeHeadDim: 8,
				VHeadDim: 8, FirstDenseLayers: 1, RoutedScalingFactor: 2.5, ExpertGroups: 4, ExpertGroupsUsed: 2}
			c.want(&want)
			if !m.Shape.Equal(want) {
				t.Fatalf("shape\n got %+v\nwant %+v", m.Shape, want)
			}
			for _, w := range m.Tensors {
				want := map[bridge.WeightKind]int{bridge.WeightQ: 4, bridge.WeightKVA: 1}[w.Kind]
				if w.InterleavedRopeHeads != want {
					t.Errorf("%s: interleaved rope heads %d, want %d", w.Name, w.InterleavedRopeHeads, want)
				}
			}
		})
	}
}

// TestCrossFormatDeepSeek: each deepseek2 file written again as a Hugging
// Face directory (config.json of model_type deepseek_v2/v3, kv_b_proj
// rebuilt from llama.cpp's attn_k_b/attn_v_b split, per-expert tensors,
// e_score_correction_bias) loads to the same shape and runs to the same
// bits on the CPU engine.
func TestCrossFormatDeepSeek(t *testing.T) {
	for _, name := range deepseekFiles {
		t.Run(name, func(t *testing.T) {
			gg := loadOK(t, deepseekPath(name))
			hf := loadOK(t, writeDeepSeekHF(t, gg))
			if !reflect.DeepEqual(gg.Shape, hf.Shape) {
				t.Fatalf("shapes differ:\ngguf %+v\n  hf %+v", gg.Shape, hf.Shape)
			}
			prompt := gg.Tokenizer.Encode("The capital of France is", EncodeOptions{})
			if !reflect.DeepEqual(prompt, hf.Tokenizer.Encode("The capital of France is", EncodeOptions{})) {
				t.Fatal("the tokenizers encode the prompt differently")
			}
			requireSameRun(t, runEngine(t, gg, prompt), runEngine(t, hf, prompt))
		})
	}
}

// TestHFDeepSeekRefusals: what a DeepSeek config may say that the engine
// does not compute is refused by name.
func TestHFDeepSeekRefusals(t *testing.T) {
	gg := loadOK(t, deepseekPath("deepseek2"))
	for _, c := range []struct {
		name  string
		edit  func(cfg map[string]any)
		words []string
	}{
		{"fp8", func(cfg map[string]any) {
			cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []int{128, 128}}
		}, []string{"quantization_config", "FP8"}},
		{"moe stride", func(cfg map[string]any) { cfg["moe_layer_freq"] = 2 }, []string{"moe_layer_freq 2"}},
		{"scoring", func(cfg map[string]any) { cfg["scoring_func"] = "tanh" }, []string{`scoring_func "tanh"`}},
		{"topk method", func(cfg map[string]any) { cfg["topk_method"] = "noaux_tc"; cfg["scoring_func"] = "softmax" },
			[]string{`topk_method "noaux_tc"`}},
		{"yarn on llama", func(cfg map[string]any) { cfg["model_type"] = "llama" }, []string{`"yarn"`, "DeepSeek"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeDeepSeekHF(t, gg, func(cfg map[string]any) {
				cfg["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4, "original_max_position_embeddings": 32}
				c.edit(cfg)
			})
			_, err := Load(dir)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range c.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// f32Values are an F32 weight's values (the fixtures are F32).
func f32Values(t *testing.T, w bridge.WeightTensor) []float32 {
	t.Helper()
	if w.DType != bridge.DTypeF32 {
		t.Fatalf("%s is %s; the test data is F32", w.Name, w.DType)
	}
	out := make([]float32, len(w.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*i:]))
	}
	return out
}

// stF32 is an F32 safetensors tensor of [rows][cols] (a vector when rows
// is 1).
func stF32(t *testing.T, name string, rows, cols int64, data []float32) stTensor {
	shape := []int{int(rows), int(cols)}
	if rows == 1 {
		shape = []int{int(cols)}
	}
	return stTensor{name, "F32", shape, encode(t, "F32", data)}
}

// writeDeepSeekHF writes a loaded deepseek2 GGUF model as a Hugging Face
// directory (F32, one shard) and returns it.
func writeDeepSeekHF(t *testing.T, m *Model, edits ...func(cfg map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	s := m.Shape
	modelType := "deepseek_v3"
	if !s.RouterNorm.Sigmoid() {
		modelType = "deepseek_v2"
	}
	cfg := map[string]any{
		"_name_or_path": m.Name, "architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": modelType,
		"hidden_size": s.HiddenSize, "intermediate_size": s.IntermediateSize, "num_hidden_layers": s.NumLayers,
		"num_attention_heads": s.NumHeads, "num_key_value_heads": s.NumHeads, "vocab_size": s.VocabSize,
		"rope_theta": float64(s.RopeTheta), "rms_norm_eps": float64(s.RMSEps), "tie_word_embeddings": s.TiedEmbeddings,
		"max_position_embeddings": m.ContextLength, "hidden_act": "silu", "attention_bias": false,
		"kv_lora_rank": s.KVLoraRank, "qk_nope_head_dim": s.QKNopeHeadDim, "qk_rope_head_dim": s.QKRopeHeadDim,
		"v_head_dim": s.VHeadDim, "first_k_dense_replace": s.FirstDenseLayers, "moe_layer_freq": 1,
		"n_routed_experts": s.NumExperts, "n_shared_experts": s.NumSharedExperts, "num_experts_per_tok": s.NumExpertsPerTok,
		"moe_intermediate_size": s.MoEIntermediateSize, "routed_scaling_factor": float64(s.RoutedScalingFactor),
		"norm_topk_prob": s.RouterNorm == bridge.RouterSigmoidTopK || s.RouterNorm == bridge.RouterSoftmaxTopK,
		"scoring_func":   map[bool]string{true: "sigmoid", false: "softmax"}[s.RouterNorm.Sigmoid()],
		"topk_method":    "greedy", "n_group": 1, "topk_group": 1, "q_lora_rank": nil, "rope_scaling": nil,
	}
	if s.QLoraRank > 0 {
		cfg["q_lora_rank"] = s.QLoraRank
	}
	if s.ExpertGroups > 0 {
		cfg["topk_method"] = map[bool]string{true: "noaux_tc", false: "group_limited_greedy"}[s.RouterNorm.Sigmoid()]
		cfg["n_group"], cfg["topk_group"] = s.ExpertGroups, s.ExpertGroupsUsed
	}
	if y := s.Yarn; y != nil {
		cfg["rope_scaling"] = map[string]any{"type": "yarn", "factor": y.Factor, "original_max_position_embeddings": y.OriginalMaxPositions,
			"beta_fast": y.BetaFast, "beta_slow": y.BetaSlow, "mscale": y.MScale, "mscale_all_dim": y.MScaleAllDim}
	}
	for _, e := range edits {
		e(cfg)
	}
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)

	f32 := func(w bridge.WeightTensor) []float32 { return f32Values(t, w) }
	var ts []stTensor
	add := func(name string, rows, cols int64, data []float32) { ts = append(ts, stF32(t, name, rows, cols, data)) }
	layerNames := map[bridge.WeightKind]string{
		bridge.WeightAttnNorm: "input_layernorm", bridge.WeightMLPNorm: "post_attention_layernorm",
		bridge.WeightQA: "self_attn.q_a_proj", bridge.WeightQANorm: "self_attn.q_a_layernorm",
		bridge.WeightKVA: "self_attn.kv_a_proj_with_mqa", bridge.WeightKVANorm: "self_attn.kv_a_layernorm",
		bridge.WeightKVB: "self_attn.kv_b_proj", bridge.WeightO: "self_attn.o_proj",
		bridge.WeightGate: "mlp.gate_proj", bridge.WeightUp: "mlp.up_proj", bridge.WeightDown: "mlp.down_proj",
		bridge.WeightRouter: "mlp.gate", bridge.WeightSharedGate: "mlp.shared_experts.gate_proj",
		bridge.WeightSharedUp: "mlp.shared_experts.up_proj", bridge.WeightSharedDown: "mlp.shared_experts.down_proj",
	}
	kb, vb := map[int][]float32{}, map[int][]float32{}
	for _, w := range m.Tensors {
		lp := fmt.Sprintf("model.layers.%d.", w.Layer)
		switch {
		case w.Kind == bridge.WeightEmbedding:
			add("model.embed_tokens.weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightFinalNorm:
			add("model.norm.weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightLMHead:
			add("lm_head.weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightQ:
			add(lp+map[bool]string{true: "self_attn.q_b_proj", false: "self_attn.q_proj"}[s.QLoraRank > 0]+".weight", w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightRouterBias:
			add(lp+"mlp.gate.e_score_correction_bias", w.Rows, w.Cols, f32(w))
		case w.Kind.IsExpert():
			part := map[bridge.WeightKind]string{bridge.WeightExpertGate: "gate_proj", bridge.WeightExpertUp: "up_proj", bridge.WeightExpertDown: "down_proj"}[w.Kind]
			add(fmt.Sprintf("%smlp.experts.%d.%s.weight", lp, w.Expert, part), w.Rows, w.Cols, f32(w))
		case w.Kind == bridge.WeightKB:
			kb[w.Layer] = f32(w)
		case w.Kind == bridge.WeightVB:
			vb[w.Layer] = f32(w)
		default:
			n, ok := layerNames[w.Kind]
			if !ok {
				t.Fatalf("%s: no Hugging Face name for kind %d", w.Name, w.Kind)
			}
			add(lp+n+".weight", w.Rows, w.Cols, f32(w))
		}
	}
	// kv_b_proj from the split: per head the nope rows (attn_k_b transposed)
	// then the v rows (attn_v_b as is).
	H, KL, N, V := s.NumHeads, s.KVLoraRank, s.QKNopeHeadDim, s.VHeadDim
	for l, k := range kb {
		v := vb[l]
		kvb := make([]float32, H*(N+V)*KL)
		for h := 0; h < H; h++ {
			for c := 0; c < KL; c++ {
				for d := 0; d < N; d++ {
					kvb[(h*(N+V)+d)*KL+c] = k[(h*KL+c)*N+d]
				}
				for j := 0; j < V; j++ {
					kvb[(h*(N+V)+N+j)*KL+c] = v[(h*V+j)*KL+c]
				}
			}
		}
		add(fmt.Sprintf("model.layers.%d.self_attn.kv_b_proj.weight", l), int64(H*(N+V)), int64(KL), kvb)
	}
	writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
	sp := m.Tokenizer.Spec()
	writeHFTokenizer(t, dir, &tinyModel{tokens: sp.Tokens, types: sp.TokenTypes, merges: sp.Merges, bos: sp.BOS, eos: sp.EOS,
		addBOS: sp.AddBOS, tmpl: sp.ChatTemplate})
	return dir
}

// TestDeepSeekQuantisedTensors: deepseek2 with its projections of 32-wide
// rows given as Q8_0 blocks (q_a, kv_a_mqa with its interleaved rope tail,
// o_proj, the dense and expert gate/up, the shared experts, the LM head)
// loads and, with the exact kernels, runs to the bits of an F32 copy of the
// dequantised values; with the quantised kernels it runs too and gives the
// same first greedy token.
func TestDeepSeekQuantisedTensors(t *testing.T) {
	if !haveEngine() {
		t.Skip("built without the native engine (go test -tags native)")
	}
	m := loadOK(t, deepseekPath("deepseek2"))
	q8, f32 := *m, *m
	q8.Tensors, f32.Tensors = nil, nil
	quantised := 0
	for _, w := range m.Tensors {
		if w.Rows == 1 || w.Cols%32 != 0 || w.Kind == bridge.WeightEmbedding {
			q8.Tensors, f32.Tensors = append(q8.Tensors, w), append(f32.Tensors, w)
			continue
		}
		vals := make([]float32, w.Rows*w.Cols)
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*i:]))
		}
		blocks := quantiseQ8(vals)
		x := w
		x.DType, x.Data = bridge.DTypeQ8_0, blocks
		q8.Tensors = append(q8.Tensors, x)
		y := w
		y.Data = encode(t, "F32", vals)
		f32.Tensors = append(f32.Tensors, y)
		quantised++
	}
	if quantised < 10 {
		t.Fatalf("only %d tensors have 32-wide rows", quantised)
	}
	prompt := m.Tokenizer.Encode("The capital of France is", EncodeOptions{})
	exact := runEngine(t, &q8, prompt)
	requireSameRun(t, exact, runEngine(t, &f32, prompt))
	eng, err := native.Open(bridge.Config{Shape: m.Shape, Tensors: q8.Tensors, NumPages: 8, TokensPerPage: 4,
		CPUKernels: "quant"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	var res bridge.StepResult
	if err := eng.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt, BlockTable: table, Sample: true}}, WantLogits: true}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Sampled[0] != exact.sampled[0] {
		t.Errorf("quantised kernels sampled %d first, the exact ones %d", res.Sampled[0], exact.sampled[0])
	}
}
