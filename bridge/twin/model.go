package twin

import (
	"fmt"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Model is a decoder's shape as the cost model needs it. Attention is GQA
// (NumKVHeads, HeadDim) unless KVLoraRank > 0, which makes it MLA
// (multi-head latent attention, DeepSeek-V2/V3): the cache holds one
// compressed latent of KVLoraRank + QKRopeHeadDim elements per token and
// layer. The MLP is dense SwiGLU unless RoutedExperts > 0, which makes every
// layer after the first DenseLayers a mixture of experts.
//
// Field units: counts of layers, heads, experts; widths in elements; element
// sizes in bytes.
type Model struct {
	// Name is the model's name (a built-in's key, or a bridge preset's).
	Name            string `json:"name"`
	Layers          int    `json:"num_layers"`
	Hidden          int    `json:"hidden_size"`
	Heads           int    `json:"num_heads"`
	KVHeads         int    `json:"num_kv_heads"`      // GQA only; 0 for MLA
	HeadDim         int    `json:"head_dim"`          // GQA only; 0 for MLA
	Intermediate    int    `json:"intermediate_size"` // dense SwiGLU layers
	Vocab           int    `json:"vocab_size"`
	QLoraRank       int    `json:"q_lora_rank"`      // MLA; 0 = no query compression
	KVLoraRank      int    `json:"kv_lora_rank"`     // MLA when > 0
	QKNopeHeadDim   int    `json:"qk_nope_head_dim"` // MLA
	QKRopeHeadDim   int    `json:"qk_rope_head_dim"` // MLA
	VHeadDim        int    `json:"v_head_dim"`       // MLA
	RoutedExperts   int    `json:"routed_experts"`   // MoE when > 0
	SharedExperts   int    `json:"shared_experts"`   // MoE
	TopK            int    `json:"top_k"`            // MoE: routed experts per token
	MoEIntermediate int    `json:"moe_intermediate_size"`
	DenseLayers     int    `json:"dense_layers"` // MoE: leading layers with a dense MLP
	// SlidingWindow > 0: the layers SlidingWindowPattern picks attend to
	// the last SlidingWindow positions only (engine.h's pattern: 0 = every
	// layer, p = all but each p-th); their attention costs that much.
	SlidingWindow        int `json:"sliding_window,omitempty"`
	SlidingWindowPattern int `json:"sliding_window_pattern,omitempty"`
	// WeightBytes is the element size of the layers' linear weights: 2 for
	// BF16, 1 for FP8 (whose GEMMs then run at the GPU's FP8 rate), 0.5625
	// for NVFP4 (4 bits and an 8-bit scale per 16; the GPU's FP4 rate).
	WeightBytes float64 `json:"weight_bytes"`
	// EmbeddingBytes is the element size of the embedding and LM head (and
	// of norm weights), which stay BF16 in FP8 checkpoints.
	EmbeddingBytes int `json:"embedding_bytes"`
	// KVBytes is the element size of the KV cache.
	KVBytes int `json:"kv_bytes"`
	// Source says where the shape comes from.
	Source string `json:"source"`
}

// MLA reports whether attention is multi-head latent attention.
func (m *Model) MLA() bool { return m.KVLoraRank > 0 }

// SlidingLayers is how many layers have the sliding window.
func (m *Model) SlidingLayers() int {
	if m.SlidingWindow <= 0 {
		return 0
	}
	if p := m.SlidingWindowPattern; p >= 2 {
		return m.Layers - m.Layers/p
	}
	return m.Layers
}

// MoE reports whether the model has routed experts.
func (m *Model) MoE() bool { return m.RoutedExperts > 0 }

// MoELayers is the number of mixture-of-experts layers (0 for dense models).
func (m *Model) MoELayers() int {
	if !m.MoE() {
		return 0
	}
	return m.Layers - m.DenseLayers
}

const (
	srcDeepSeekV3 = "DeepSeek-V3 config.json (huggingface.co/deepseek-ai/DeepSeek-V3) and technical report arXiv:2412.19437: " +
		"61 layers, hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, " +
		"256 routed + 1 shared experts, top-8, moe_intermediate 2048, first_k_dense_replace 3 (intermediate 18432), vocab 129280; " +
		"weights shipped as FP8 (e4m3, 128x128 block scales, scales not counted), embedding/LM head BF16; KV latent cached in BF16"
	srcKimiK2 = "Kimi K2 config.json (huggingface.co/moonshotai/Kimi-K2-Instruct): DeepSeek-V3 architecture with " +
		"64 heads, 384 routed + 1 shared experts, top-8, first_k_dense_replace 1, vocab 163840; FP8 block-quantised weights, BF16 embedding/LM head and KV latent"
)

const srcLlama2 = "Llama 2 config.json (huggingface.co/meta-llama/Llama-2-7b-hf, Llama-2-70b-hf), as Vidur's " +
	"vidur/config/model_config.py gives it for its profiles (github.com/microsoft/vidur): "

// builtinModels are the models that are not bridge presets: the MLA + MoE
// ones, and Llama 2, whose shapes the published operator profiles the twin
// is validated against (Vidur's) were measured on. The Llama-3-shaped ones
// come from bridge.Presets so that they cannot drift from the engines'
// presets.
var builtinModels = map[string]Model{
	"llama-2-7b": {
		Name: "llama-2-7b", Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 32, HeadDim: 128, Intermediate: 11008, Vocab: 32000,
		WeightBytes: 2, EmbeddingBytes: 2, KVBytes: 2,
		Source: srcLlama2 + "32 layers, hidden 4096, 32 heads (MHA), intermediate 11008, vocab 32000; BF16 weights and KV cache",
	},
	"llama-2-70b": {
		Name: "llama-2-70b", Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, HeadDim: 128, Intermediate: 28672, Vocab: 32000,
		WeightBytes: 2, EmbeddingBytes: 2, KVBytes: 2,
		Source: srcLlama2 + "80 layers, hidden 8192, 64 heads over 8 KV heads, intermediate 28672, vocab 32000; BF16 weights and KV cache",
	},
	"deepseek-v3": {
		Name: "deepseek-v3", Layers: 61, Hidden: 7168, Heads: 128, Intermediate: 18432, Vocab: 129280,
		QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		RoutedExperts: 256, SharedExperts: 1, TopK: 8, MoEIntermediate: 2048, DenseLayers: 3,
		WeightBytes: 1, EmbeddingBytes: 2, KVBytes: 2, Source: srcDeepSeekV3,
	},
	"kimi-k2": {
		Name: "kimi-k2", Layers: 61, Hidden: 7168, Heads: 64, Intermediate: 18432, Vocab: 163840,
		QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		RoutedExperts: 384, SharedExperts: 1, TopK: 8, MoEIntermediate: 2048, DenseLayers: 1,
		WeightBytes: 1, EmbeddingBytes: 2, KVBytes: 2, Source: srcKimiK2,
	},
}

// ModelNames lists the built-in models: the MLA/MoE ones, Llama 2 and
// every bridge preset (the Llama-shaped synthetic models, including "tiny").
func ModelNames() []string {
	seen := map[string]bool{}
	for _, n := range bridge.PresetNames() {
		seen[n] = true
	}
	for n := range builtinModels {
		seen[n] = true
	}
	return sortedKeys(seen)
}

// BuiltinModel returns a built-in model or an error listing the allowed names.
func BuiltinModel(name string) (Model, error) {
	if m, ok := builtinModels[name]; ok {
		return m, nil
	}
	if s, ok := bridge.Presets[name]; ok {
		return ModelFromShape(name, s), nil
	}
	return Model{}, fmt.Errorf("unknown model %q (allowed: %s)", name, strings.Join(ModelNames(), ", "))
}

// ModelFromShape turns a Llama-architecture shape (GQA, dense SwiGLU MLP,
// untied embedding and LM head) into a BF16 model with a BF16 KV cache.
// A MoE shape (NumExperts > 0) becomes a model whose every layer is a
// mixture of experts (DenseLayers 0) with the shape's experts, top-k and
// shared experts.
func ModelFromShape(name string, s bridge.ModelShape) Model {
	m := Model{
		Name: name, Layers: s.NumLayers, Hidden: s.HiddenSize, Heads: s.NumHeads, KVHeads: s.NumKVHeads,
		HeadDim: s.HeadDim, Intermediate: s.IntermediateSize, Vocab: s.VocabSize,
		WeightBytes: 2, EmbeddingBytes: 2, KVBytes: 2,
		Source: fmt.Sprintf("bridge.Presets[%q] (Llama architecture: GQA, SwiGLU, untied LM head); BF16 weights and KV cache", name),
	}
	if s.MoE() {
		m.RoutedExperts, m.TopK, m.MoEIntermediate, m.SharedExperts = s.NumExperts, s.NumExpertsPerTok, s.MoEIntermediateSize, s.NumSharedExperts
		m.DenseLayers = s.FirstDenseLayers
		m.Source = fmt.Sprintf("bridge.Presets[%q] (Llama-architecture attention, every layer a mixture of %d experts, top-%d, %d shared); "+
			"BF16 weights and KV cache", name, s.NumExperts, s.NumExpertsPerTok, s.NumSharedExperts)
	}
	m.SlidingWindow, m.SlidingWindowPattern = s.SlidingWindow, s.SlidingWindowPattern
	if s.SlidingWindow > 0 {
		m.Source += fmt.Sprintf("; a %d-position sliding window on %d of %d layers", s.SlidingWindow, m.SlidingLayers(), m.Layers)
	}
	if s.MLA() {
		m.KVHeads, m.HeadDim = 0, 0
		m.QLoraRank, m.KVLoraRank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim = s.QLoraRank, s.KVLoraRank, s.QKNopeHeadDim, s.QKRopeHeadDim, s.VHeadDim
		m.Source = fmt.Sprintf("bridge.Presets[%q] (DeepSeek architecture: MLA, %d dense layers, then %d experts, top-%d, %d shared); "+
			"BF16 weights and KV latent", name, s.FirstDenseLayers, s.NumExperts, s.NumExpertsPerTok, s.NumSharedExperts)
	}
	return m
}

// Shape is the bridge shape the engine reports: the bridge preset of the
// model's name when the geometry is the preset's (its RoPE, norm, router,
// YaRN and Gemma constants change none of the twin's costs), else the model's own
// geometry with default constants. MLA models report their latent
// attention (KVLoraRank …, NumKVHeads = NumHeads, HeadDim = nope + rope),
// their leading dense layers and experts.
func (m *Model) Shape() bridge.ModelShape {
	s := bridge.ModelShape{NumLayers: m.Layers, HiddenSize: m.Hidden, NumHeads: m.Heads, NumKVHeads: m.KVHeads,
		HeadDim: m.HeadDim, IntermediateSize: m.Intermediate, VocabSize: m.Vocab, RopeTheta: 500000, RMSEps: 1e-5}
	if m.MoE() && (m.DenseLayers == 0 || m.MLA()) {
		s.NumExperts, s.NumExpertsPerTok, s.MoEIntermediateSize, s.NumSharedExperts = m.RoutedExperts, m.TopK, m.MoEIntermediate, m.SharedExperts
		s.FirstDenseLayers = m.DenseLayers
	}
	s.SlidingWindow, s.SlidingWindowPattern = m.SlidingWindow, m.SlidingWindowPattern
	if m.MLA() {
		s.NumKVHeads, s.HeadDim = m.Heads, m.QKNopeHeadDim+m.QKRopeHeadDim
		s.QLoraRank, s.KVLoraRank, s.QKNopeHeadDim, s.QKRopeHeadDim, s.VHeadDim = m.QLoraRank, m.KVLoraRank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim
		s.RopeTheta, s.RMSEps = 10000, 1e-6
		if s.NumExperts > 0 {
			s.RouterNorm = bridge.RouterSigmoidTopK
		}
	}
	if p, ok := bridge.Presets[m.Name]; ok {
		q := p
		q.RopeTheta, q.RMSEps, q.RouterNorm, q.QKNorm, q.QKVBias = s.RopeTheta, s.RMSEps, s.RouterNorm, s.QKNorm, s.QKVBias
		q.RoutedScalingFactor, q.ExpertGroups, q.ExpertGroupsUsed, q.Yarn = 0, 0, 0, nil
		// (Gemma's element-wise fields and RoPE forms: not costed; its
		// window is, docs/twin.md)
		q.EmbeddingScale, q.MLPGelu, q.PostNorms, q.AttnSoftcap, q.FinalSoftcap = 0, false, false, 0, 0
		q.RopeLocalTheta, q.RopeLinearFactor = 0, 0
		q.PartialRotaryDim, q.RopeAttnFactor = 0, 0
		if q.Equal(s) {
			return p
		}
	}
	return s
}

// validate checks the shape; the error names the JSON field.
func (m *Model) validate() error {
	pos := func(field string, v int) error {
		if v <= 0 {
			return fmt.Errorf("model.%s must be positive, got %d", field, v)
		}
		return nil
	}
	zero := func(field string, v int, why string) error {
		if v != 0 {
			return fmt.Errorf("model.%s must be 0 %s, got %d", field, why, v)
		}
		return nil
	}
	weightElem := func(v float64) error {
		if v != 1 && v != 2 && v != nvfp4Bytes {
			return fmt.Errorf("model.weight_bytes must be 2 (BF16), 1 (FP8) or %g (NVFP4), got %g", nvfp4Bytes, v)
		}
		return nil
	}
	elem := func(field string, v int) error {
		if v != 1 && v != 2 {
			return fmt.Errorf("model.%s must be 1 (FP8) or 2 (BF16), got %d", field, v)
		}
		return nil
	}
	if m.Name == "" {
		return fmt.Errorf("model.name is empty")
	}
	if m.Source == "" {
		return fmt.Errorf("model.source is empty: say where the shape comes from")
	}
	checks := []error{
		pos("num_layers", m.Layers), pos("hidden_size", m.Hidden), pos("num_heads", m.Heads),
		pos("vocab_size", m.Vocab), weightElem(m.WeightBytes),
		elem("embedding_bytes", m.EmbeddingBytes), elem("kv_bytes", m.KVBytes),
	}
	if m.MLA() {
		const why = "for an MLA model (kv_lora_rank > 0)"
		checks = append(checks, zero("num_kv_heads", m.KVHeads, why), zero("head_dim", m.HeadDim, why),
			pos("qk_nope_head_dim", m.QKNopeHeadDim), pos("qk_rope_head_dim", m.QKRopeHeadDim),
			pos("v_head_dim", m.VHeadDim))
		if m.QLoraRank < 0 {
			checks = append(checks, fmt.Errorf("model.q_lora_rank must not be negative, got %d", m.QLoraRank))
		}
		if m.Heads > 0 && (m.Hidden%m.Heads != 0 || (m.Hidden/m.Heads)%2 != 0) { // heads ≤ 0: pos above
			checks = append(checks, fmt.Errorf("model.hidden_size %d must be an even multiple of num_heads %d (for the GQA-equivalent shape)", m.Hidden, m.Heads))
		}
	} else {
		const why = "for a GQA model (kv_lora_rank 0)"
		checks = append(checks, pos("num_kv_heads", m.KVHeads), pos("head_dim", m.HeadDim),
			zero("q_lora_rank", m.QLoraRank, why), zero("qk_nope_head_dim", m.QKNopeHeadDim, why),
			zero("qk_rope_head_dim", m.QKRopeHeadDim, why), zero("v_head_dim", m.VHeadDim, why))
		if m.KVHeads > 0 && m.Heads%m.KVHeads != 0 {
			checks = append(checks, fmt.Errorf("model.num_kv_heads %d must divide num_heads %d", m.KVHeads, m.Heads))
		}
	}
	switch {
	case m.SlidingWindow < 0:
		checks = append(checks, fmt.Errorf("model.sliding_window must be >= 0 (0 = none), got %d", m.SlidingWindow))
	case m.SlidingWindowPattern < 0 || m.SlidingWindowPattern == 1:
		checks = append(checks, fmt.Errorf("model.sliding_window_pattern must be 0 (every layer slides) or >= 2, got %d", m.SlidingWindowPattern))
	case m.SlidingWindow == 0 && m.SlidingWindowPattern != 0:
		checks = append(checks, fmt.Errorf("model.sliding_window_pattern needs a sliding_window"))
	case m.SlidingWindow > 0 && m.MLA():
		checks = append(checks, fmt.Errorf("model.sliding_window with MLA is not supported"))
	}
	if m.MoE() {
		checks = append(checks, pos("top_k", m.TopK), pos("moe_intermediate_size", m.MoEIntermediate))
		switch {
		case m.TopK > m.RoutedExperts:
			checks = append(checks, fmt.Errorf("model.top_k %d exceeds routed_experts %d", m.TopK, m.RoutedExperts))
		case m.SharedExperts < 0:
			checks = append(checks, fmt.Errorf("model.shared_experts must not be negative, got %d", m.SharedExperts))
		case m.DenseLayers < 0 || m.DenseLayers >= m.Layers:
			checks = append(checks, fmt.Errorf("model.dense_layers must be in [0, num_layers %d), got %d", m.Layers, m.DenseLayers))
		}
		if m.DenseLayers > 0 {
			checks = append(checks, pos("intermediate_size", m.Intermediate))
		}
	} else {
		const why = "for a dense model (routed_experts 0)"
		checks = append(checks, pos("intermediate_size", m.Intermediate),
			zero("shared_experts", m.SharedExperts, why), zero("top_k", m.TopK, why),
			zero("moe_intermediate_size", m.MoEIntermediate, why), zero("dense_layers", m.DenseLayers, why))
		if m.RoutedExperts < 0 {
			checks = append(checks, fmt.Errorf("model.routed_experts must not be negative, got %d", m.RoutedExperts))
		}
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}
