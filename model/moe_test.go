package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// newTinyMoE turns the tiny model into a mixture of experts of the given
// GGUF architecture ("qwen3moe" or "llama"): every layer's MLP becomes a
// router over E experts (top-2) with stacked 3-D expert tensors of width 32
// (as llama.cpp writes them), and qwen3moe gets per-head q/k norms.
func newTinyMoE(arch string, E int) *tinyModel {
	m := newTinyModel(29, false)
	s := &m.shape
	const F = 32
	s.NumExperts, s.NumExpertsPerTok, s.MoEIntermediateSize = E, 2, F
	s.RouterNorm = bridge.RouterTopKSoftmax
	if arch == "qwen3moe" {
		s.RouterNorm, s.QKNorm = bridge.RouterSoftmaxTopK, true
	}
	val := func(n int, k int) []float32 {
		d := make([]float32, n)
		for i := range d {
			d[i] = float32((i*7+k*13)%511-255) / 1024
		}
		return d
	}
	var out []*tinyTensor
	for _, x := range m.tensors {
		switch x.kind {
		case bridge.WeightGate, bridge.WeightUp:
			continue
		case bridge.WeightDown:
			l, H := x.layer, s.HiddenSize
			gp := fmt.Sprintf("blk.%d.", l)
			out = append(out,
				&tinyTensor{gguf: gp + "ffn_gate_inp.weight", kind: bridge.WeightRouter, layer: l, rows: E, cols: H, data: val(E*H, l+1)},
				&tinyTensor{gguf: gp + "ffn_gate_exps.weight", kind: bridge.WeightExpertGate, layer: l, rows: E * F, cols: H, data: val(E*F*H, l+2), experts: E},
				&tinyTensor{gguf: gp + "ffn_up_exps.weight", kind: bridge.WeightExpertUp, layer: l, rows: E * F, cols: H, data: val(E*F*H, l+3), experts: E},
				&tinyTensor{gguf: gp + "ffn_down_exps.weight", kind: bridge.WeightExpertDown, layer: l, rows: E * H, cols: F, data: val(E*H*F, l+4), experts: E})
			if s.QKNorm {
				for k, n := range []string{"attn_q_norm", "attn_k_norm"} {
					d := make([]float32, s.HeadDim)
					for i := range d {
						d[i] = 1 + float32((i+k)%9-4)/64
					}
					out = append(out, &tinyTensor{gguf: gp + n + ".weight", kind: bridge.WeightQNorm + bridge.WeightKind(k), layer: l, rows: 1, cols: s.HeadDim, data: d})
				}
			}
			continue
		}
		out = append(out, x)
	}
	m.tensors = out
	return m
}

// moeKVs adds the MoE metadata of arch.
func moeKVs(arch string, m *tinyModel, edit func([]ggufKV) []ggufKV) func([]ggufKV) []ggufKV {
	return func(kvs []ggufKV) []ggufKV {
		kvs = append(kvs, ggufKV{arch + ".expert_count", uint32(m.shape.NumExperts)},
			ggufKV{arch + ".expert_used_count", uint32(m.shape.NumExpertsPerTok)})
		if arch == "qwen3moe" {
			kvs = append(kvs, ggufKV{arch + ".expert_feed_forward_length", uint32(m.shape.MoEIntermediateSize)})
		} else {
			for i := range kvs {
				if kvs[i].key == arch+".feed_forward_length" {
					kvs[i].val = uint32(m.shape.MoEIntermediateSize)
				}
			}
		}
		if edit != nil {
			kvs = edit(kvs)
		}
		return kvs
	}
}

// TestGGUFMoELoads: qwen3moe and llama-with-experts files load as MoE
// shapes; each stacked expert tensor becomes one tensor per expert whose
// data is that expert's plane; Qwen's Q/K rows are not de-interleaved.
func TestGGUFMoELoads(t *testing.T) {
	for _, arch := range []string{"qwen3moe", "llama"} {
		t.Run(arch, func(t *testing.T) {
			src := newTinyMoE(arch, 4)
			m, err := Load(writeGGUF(t, src, ggufOptions{arch: arch, kvs: moeKVs(arch, src, nil)}))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			want := src.shape
			want.IntermediateSize = m.Shape.IntermediateSize
			if m.Shape != want {
				t.Fatalf("shape %+v\nwant  %+v", m.Shape, want)
			}
			experts := 0
			for _, x := range m.Tensors {
				switch {
				case x.Kind.IsExpert():
					experts++
					if x.Rows != int64(map[bool]int{true: 64, false: 32}[x.Kind == bridge.WeightExpertDown]) {
						t.Errorf("%s: %d rows", x.Name, x.Rows)
					}
					if !strings.Contains(x.Name, fmt.Sprintf("[expert %d]", x.Expert)) {
						t.Errorf("%s: expert %d", x.Name, x.Expert)
					}
				case x.Kind == bridge.WeightQ || x.Kind == bridge.WeightK:
					if (x.InterleavedRopeHeads > 0) != (arch == "llama") {
						t.Errorf("%s: InterleavedRopeHeads %d for %s", x.Name, x.InterleavedRopeHeads, arch)
					}
				}
			}
			if experts != 2*3*4 {
				t.Errorf("%d expert tensors, want 24", experts)
			}
			// Expert 2's gate of layer 1 is its plane of the stacked tensor.
			var stacked []float32
			for _, x := range src.tensors {
				if x.gguf == "blk.1.ffn_gate_exps.weight" {
					stacked = x.data
				}
			}
			for _, x := range m.Tensors {
				if x.Kind == bridge.WeightExpertGate && x.Layer == 1 && x.Expert == 2 {
					got := decodeF32(x.Data)
					if !slices.Equal(got, stacked[2*32*64:3*32*64]) {
						t.Error("layer 1 expert 2 gate is not the third plane of the stacked tensor")
					}
				}
			}
		})
	}
}

func decodeF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestGGUFMoERefusals: what the loader cannot run is refused by name.
func TestGGUFMoERefusals(t *testing.T) {
	drop := func(key string) func([]ggufKV) []ggufKV {
		return func(kvs []ggufKV) []ggufKV {
			return slices.DeleteFunc(kvs, func(kv ggufKV) bool { return kv.key == key })
		}
	}
	set := func(key string, v any) func([]ggufKV) []ggufKV {
		return func(kvs []ggufKV) []ggufKV { return append(drop(key)(kvs), ggufKV{key, v}) }
	}
	for _, c := range []struct {
		name  string
		arch  string
		edit  func(*tinyModel)
		kvs   func([]ggufKV) []ggufKV
		words []string
	}{
		{"shared-expert gate of qwen2moe", "qwen3moe", func(m *tinyModel) {
			m.tensors = append(m.tensors, &tinyTensor{gguf: "blk.0.ffn_gate_inp_shexp.weight", rows: 1, cols: 64, data: make([]float32, 64)})
		}, nil, []string{"blk.0.ffn_gate_inp_shexp.weight", "not part of a qwen3moe decoder"}},
		{"stacked count differs", "qwen3moe", nil, set("qwen3moe.expert_count", uint32(8)), []string{"stacks 4 experts", "expert_count is 8"}},
		{"no expert count", "qwen3moe", nil, drop("qwen3moe.expert_count"), []string{"qwen3moe.expert_count is missing"}},
		{"no top-k", "llama", nil, drop("llama.expert_used_count"), []string{"llama.expert_used_count is missing"}},
		{"shared experts", "llama", nil, set("llama.expert_shared_count", uint32(1)), []string{"expert_shared_count", "not supported"}},
		{"missing expert tensor", "llama", func(m *tinyModel) {
			m.tensors = slices.DeleteFunc(m.tensors, func(x *tinyTensor) bool { return x.gguf == "blk.1.ffn_up_exps.weight" })
		}, nil, []string{"missing tensor: layer 1 expert 0 expert up projection"}},
		{"dense MLP in a MoE model", "llama", func(m *tinyModel) {
			m.tensors = append(m.tensors, &tinyTensor{gguf: "blk.0.ffn_gate.weight", kind: bridge.WeightGate, rows: 96, cols: 64, data: make([]float32, 96*64)})
		}, nil, []string{"blk.0.ffn_gate.weight", "dense MLP weight in a mixture-of-experts layer"}},
		{"2-D expert tensor", "llama", func(m *tinyModel) {
			for _, x := range m.tensors {
				if x.gguf == "blk.0.ffn_down_exps.weight" {
					x.experts = 0
				}
			}
		}, nil, []string{"blk.0.ffn_down_exps.weight has 2 dimensions, want 3"}},
		{"q norm in llama", "llama", func(m *tinyModel) {
			m.tensors = append(m.tensors, &tinyTensor{gguf: "blk.0.attn_q_norm.weight", rows: 1, cols: 16, data: make([]float32, 16)})
		}, nil, []string{"blk.0.attn_q_norm.weight", "q/k norm gain"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newTinyMoE(c.arch, 4)
			if c.edit != nil {
				c.edit(m)
			}
			_, err := Load(writeGGUF(t, m, ggufOptions{arch: c.arch, kvs: moeKVs(c.arch, m, c.kvs)}))
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

// tinyMoEAsHF is the Hugging Face form of a newTinyMoE model: per-expert tensors
// under the family's names (Qwen3-MoE mlp.experts.E.*_proj, Mixtral
// block_sparse_moe.experts.E.w1/w3/w2) and the routers and q/k norms
// named as transformers saves them.
func tinyMoEAsHF(m *tinyModel, modelType string) *tinyModel {
	out := *m
	out.tensors = nil
	for _, x := range m.tensors {
		lp := fmt.Sprintf("model.layers.%d.", x.layer)
		switch {
		case x.experts > 0:
			per := x.rows / x.experts
			for e := 0; e < x.experts; e++ {
				name := map[bridge.WeightKind]string{bridge.WeightExpertGate: "gate_proj", bridge.WeightExpertUp: "up_proj", bridge.WeightExpertDown: "down_proj"}[x.kind]
				if modelType == "mixtral" {
					name = map[bridge.WeightKind]string{bridge.WeightExpertGate: "w1", bridge.WeightExpertUp: "w3", bridge.WeightExpertDown: "w2"}[x.kind]
					name = fmt.Sprintf("%sblock_sparse_moe.experts.%d.%s.weight", lp, e, name)
				} else {
					name = fmt.Sprintf("%smlp.experts.%d.%s.weight", lp, e, name)
				}
				out.tensors = append(out.tensors, &tinyTensor{hf: name, kind: x.kind, layer: x.layer, rows: per, cols: x.cols,
					data: x.data[e*per*x.cols : (e+1)*per*x.cols]})
			}
			continue
		case x.kind == bridge.WeightRouter:
			y := *x
			y.hf = lp + map[bool]string{true: "block_sparse_moe.gate.weight", false: "mlp.gate.weight"}[modelType == "mixtral"]
			out.tensors = append(out.tensors, &y)
			continue
		case x.kind == bridge.WeightQNorm || x.kind == bridge.WeightKNorm:
			y := *x
			y.hf = lp + map[bool]string{true: "self_attn.q_norm.weight", false: "self_attn.k_norm.weight"}[x.kind == bridge.WeightQNorm]
			out.tensors = append(out.tensors, &y)
			continue
		}
		out.tensors = append(out.tensors, x)
	}
	return &out
}

// TestCrossFormatMoE: the same Qwen3-MoE and Mixtral models as GGUF files
// (stacked 3-D experts) and as sharded Hugging Face directories
// (per-expert tensors, model.safetensors.index.json) load into the same
// shape and weights and, on the native engine, the same logits bit for bit.
func TestCrossFormatMoE(t *testing.T) {
	for _, c := range []struct{ arch, modelType string }{{"qwen3moe", "qwen3_moe"}, {"llama", "mixtral"}} {
		t.Run(c.modelType, func(t *testing.T) {
			m := newTinyMoE(c.arch, 4)
			gg := writeGGUF(t, m, ggufOptions{arch: c.arch, kvs: moeKVs(c.arch, m, nil)})
			hf := writeHF(t, tinyMoEAsHF(m, c.modelType), hfOptions{config: func(cfg map[string]any) {
				cfg["model_type"] = c.modelType
				cfg["num_experts_per_tok"] = m.shape.NumExpertsPerTok
				if c.modelType == "mixtral" {
					cfg["num_local_experts"] = m.shape.NumExperts
					cfg["intermediate_size"] = m.shape.MoEIntermediateSize
					cfg["sliding_window"] = nil
				} else {
					cfg["num_experts"] = m.shape.NumExperts
					cfg["moe_intermediate_size"] = m.shape.MoEIntermediateSize
					cfg["norm_topk_prob"] = true
					cfg["decoder_sparse_step"] = 1
					cfg["mlp_only_layers"] = []int{}
				}
			}})
			crossCheck(t, gg, hf)
		})
	}
}

// TestHFMoERefusals: what the Hugging Face MoE configs may say that the
// engine does not compute is refused by name.
func TestHFMoERefusals(t *testing.T) {
	m := newTinyMoE("qwen3moe", 4)
	base := func(cfg map[string]any) {
		cfg["model_type"] = "qwen3_moe"
		cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"] = 4, 2, 32
		cfg["norm_topk_prob"] = true
	}
	for _, c := range []struct {
		name  string
		edit  func(cfg map[string]any)
		words []string
	}{
		{"no renormalisation", func(cfg map[string]any) { cfg["norm_topk_prob"] = false }, []string{"norm_topk_prob false"}},
		{"dense layers", func(cfg map[string]any) { cfg["mlp_only_layers"] = []int{1} }, []string{"mlp_only_layers [1]"}},
		{"sliding window", func(cfg map[string]any) { cfg["use_sliding_window"] = true }, []string{"sliding-window attention"}},
		{"qwen2_moe", func(cfg map[string]any) { cfg["model_type"] = "qwen2_moe" }, []string{`model_type "qwen2_moe"`}},
		{"expert out of range", func(cfg map[string]any) { cfg["num_experts"] = 3 }, []string{"model.layers.0.mlp.experts.3.gate_proj.weight", "not part of a qwen3_moe decoder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeHF(t, tinyMoEAsHF(m, "qwen3_moe"), hfOptions{config: func(cfg map[string]any) { base(cfg); c.edit(cfg) }})
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
