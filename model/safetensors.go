package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/edsrzf/mmap-go"
	"github.com/nlpodyssey/safetensors"

	"github.com/lockstep-ai/lockstep/bridge"
)

// hfModelConfig is the part of a Hugging Face config.json the decoders this
// loader reads use.
type hfModelConfig struct {
	ModelType             string          `json:"model_type"`
	Architectures         []string        `json:"architectures"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	HiddenSize            int             `json:"hidden_size"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	HeadDim               int             `json:"head_dim"`
	IntermediateSize      int             `json:"intermediate_size"`
	VocabSize             int             `json:"vocab_size"`
	RopeTheta             float64         `json:"rope_theta"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	HiddenAct             string          `json:"hidden_act"`
	AttentionBias         bool            `json:"attention_bias"`
	MLPBias               bool            `json:"mlp_bias"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	// RopeParameters: transformers 5's form of rope_theta and rope_scaling
	// (model/ropeparams.go).
	RopeParameters json.RawMessage `json:"rope_parameters"`
	NameOrPath     string          `json:"_name_or_path"`
	// Mixtures of experts: Qwen3-MoE (num_experts, moe_intermediate_size,
	// norm_topk_prob, decoder_sparse_step, mlp_only_layers) and Mixtral
	// (num_local_experts; intermediate_size is the expert width).
	NumExperts          int             `json:"num_experts"`
	NumLocalExperts     int             `json:"num_local_experts"`
	NumExpertsPerTok    int             `json:"num_experts_per_tok"`
	MoEIntermediateSize int             `json:"moe_intermediate_size"`
	NormTopKProb        *bool           `json:"norm_topk_prob"`
	DecoderSparseStep   int             `json:"decoder_sparse_step"`
	MLPOnlyLayers       []int           `json:"mlp_only_layers"`
	SharedExpertSize    int             `json:"shared_expert_intermediate_size"`
	SlidingWindow       json.RawMessage `json:"sliding_window"`
	PartialRotary       *float64        `json:"partial_rotary_factor"`
	// OriginalMaxPositionEmbeddings: Phi-3's first training context
	// (LongRoPE, model/longrope.go), read at the top level.
	OriginalMaxPositionEmbeddings int `json:"original_max_position_embeddings"`
	// GLM-4.5 (model/glm.go).
	UseQKNorm             bool `json:"use_qk_norm"`
	NumNextnPredictLayers int  `json:"num_nextn_predict_layers"`
	// ropeFactors: LongRoPE's chosen divisors as a tensor (not JSON).
	ropeFactors *bridge.WeightTensor
	// multimodal: a Gemma 3 image-text checkpoint whose text decoder this
	// config describes (model/gemma.go).
	multimodal bool
	// Granite's multipliers.
	EmbeddingMultiplier float64 `json:"embedding_multiplier"`
	ResidualMultiplier  float64 `json:"residual_multiplier"`
	AttentionMultiplier float64 `json:"attention_multiplier"`
	LogitsScaling       float64 `json:"logits_scaling"`
	// Gemma (model/gemma.go).
	HiddenActivation      string          `json:"hidden_activation"`
	QueryPreAttnScalar    *float64        `json:"query_pre_attn_scalar"`
	AttnLogitSoftcapping  json.RawMessage `json:"attn_logit_softcapping"`
	FinalLogitSoftcapping json.RawMessage `json:"final_logit_softcapping"`
	SlidingWindowPattern  int             `json:"sliding_window_pattern"`
	LayerTypes            []string        `json:"layer_types"`
	RopeLocalBaseFreq     float64         `json:"rope_local_base_freq"`
	UseSlidingWindow      bool            `json:"use_sliding_window"`
	// DeepSeek-V2/V3 and Kimi K2 (model_type deepseek_v2, deepseek_v3,
	// kimi_k2): latent attention and their MoE.
	QLoraRank          *int            `json:"q_lora_rank"`
	KVLoraRank         int             `json:"kv_lora_rank"`
	QKNopeHeadDim      int             `json:"qk_nope_head_dim"`
	QKRopeHeadDim      int             `json:"qk_rope_head_dim"`
	VHeadDim           int             `json:"v_head_dim"`
	FirstKDenseReplace int             `json:"first_k_dense_replace"`
	MoELayerFreq       *int            `json:"moe_layer_freq"`
	NRoutedExperts     int             `json:"n_routed_experts"`
	NSharedExperts     int             `json:"n_shared_experts"`
	RoutedScaling      float64         `json:"routed_scaling_factor"`
	ScoringFunc        string          `json:"scoring_func"`
	TopKMethod         string          `json:"topk_method"`
	NGroup             int             `json:"n_group"`
	TopKGroup          int             `json:"topk_group"`
	QuantizationConfig json.RawMessage `json:"quantization_config"`
}

// hfModelTypes are the config.json model_type values this loader reads.
var hfModelTypes = map[string]bool{"llama": true, "glm4_moe": true, "gemma": true, "gemma2": true, "gemma3_text": true, "gemma3": true, "granite": true, "mistral": true, "phi3": true, "qwen2": true, "qwen3": true, "qwen3_moe": true, "mixtral": true,
	"deepseek_v2": true, "deepseek_v3": true, "kimi_k2": true}

const hfModelTypeNames = "deepseek_v2, deepseek_v3, gemma, gemma2, gemma3 (its text decoder), gemma3_text, glm4_moe, granite, kimi_k2, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe"

// hfDeepSeek reports whether a model_type is DeepSeek's architecture.
func hfDeepSeek(t string) bool { return t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2" }

// hfExpertName is a routed expert's tensor (the part after model.layers.N.):
// Qwen3-MoE's mlp.experts.E.{gate,up,down}_proj, Mixtral's
// block_sparse_moe.experts.E.w1 (gate), w3 (up), w2 (down).
var hfExpertName = regexp.MustCompile(`^(?:mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)|block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3))$`)

var hfExpertKind = map[string]bridge.WeightKind{
	"gate_proj": bridge.WeightExpertGate, "up_proj": bridge.WeightExpertUp, "down_proj": bridge.WeightExpertDown,
	"w1": bridge.WeightExpertGate, "w3": bridge.WeightExpertUp, "w2": bridge.WeightExpertDown,
}

var hfLayerTensor = map[string]bridge.WeightKind{
	"input_layernorm": bridge.WeightAttnNorm, "self_attn.q_proj": bridge.WeightQ,
	"self_attn.k_proj": bridge.WeightK, "self_attn.v_proj": bridge.WeightV,
	"self_attn.o_proj": bridge.WeightO, "post_attention_layernorm": bridge.WeightMLPNorm,
	"mlp.gate_proj": bridge.WeightGate, "mlp.up_proj": bridge.WeightUp, "mlp.down_proj": bridge.WeightDown,
	"self_attn.q_norm": bridge.WeightQNorm, "self_attn.k_norm": bridge.WeightKNorm,
	"mlp.gate": bridge.WeightRouter, "block_sparse_moe.gate": bridge.WeightRouter,
	// DeepSeek (MLA, shared experts).
	"self_attn.q_a_proj": bridge.WeightQA, "self_attn.q_a_layernorm": bridge.WeightQANorm,
	"self_attn.q_b_proj": bridge.WeightQ, "self_attn.kv_a_proj_with_mqa": bridge.WeightKVA,
	"self_attn.kv_a_layernorm": bridge.WeightKVANorm, "self_attn.kv_b_proj": bridge.WeightKVB,
	"mlp.shared_experts.gate_proj": bridge.WeightSharedGate, "mlp.shared_experts.up_proj": bridge.WeightSharedUp,
	"mlp.shared_experts.down_proj": bridge.WeightSharedDown,
	// Phi-3: fused projections, split by rows on load (splitFused).
	"self_attn.qkv_proj": weightQKV, "mlp.gate_up_proj": weightGateUp,
}

// hfRouterBias is DeepSeek-V3's score-correction bias of the sigmoid router.
var hfRouterBias = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$`)

var hfGlobalTensor = map[string]bridge.WeightKind{
	"model.embed_tokens.weight": bridge.WeightEmbedding, "model.norm.weight": bridge.WeightFinalNorm,
	"lm_head.weight": bridge.WeightLMHead,
}

var hfLayerName = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)\.weight$`)

// hfAnyLayer is any tensor of a layer.
var hfAnyLayer = regexp.MustCompile(`^model\.layers\.(\d+)\.`)

// hfProjBias is a q, k or v projection's bias (Qwen2).
var hfProjBias = regexp.MustCompile(`^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.bias$`)

// hfRotaryFreqs names the rotary embedding's inverse frequencies some
// checkpoints store (derived: the engine recomputes them).
var hfRotaryFreqs = regexp.MustCompile(`rotary_emb\.inv_freq$`)

var safetensorsTypes = map[safetensors.DType]bridge.DType{
	safetensors.F32: bridge.DTypeF32, safetensors.F16: bridge.DTypeF16, safetensors.BF16: bridge.DTypeBF16,
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// hfShape reads config.json.
func hfShape(dir string) (bridge.ModelShape, hfModelConfig, error) {
	var c hfModelConfig
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return bridge.ModelShape{}, c, fmt.Errorf("model %s: %w (a Hugging Face directory needs config.json)", dir, err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return bridge.ModelShape{}, c, fmt.Errorf("model %s: config.json: %w", dir, err)
	}
	bad := func(format string, a ...any) (bridge.ModelShape, hfModelConfig, error) {
		return bridge.ModelShape{}, c, fmt.Errorf("model %s: config.json: "+format, append([]any{dir}, a...)...)
	}
	switch c.ModelType {
	case "gemma3_text":
		err = hfGemma3Text(raw, &c)
	case "gemma3":
		err = hfGemma3Multimodal(raw, &c)
	}
	if err != nil {
		return bad("%v", err)
	}
	if !hfModelTypes[c.ModelType] {
		return bad("model_type %q is not supported (supported: %s)", c.ModelType, hfModelTypeNames)
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" && !hfGemma(c.ModelType) {
		return bad("hidden_act %q is not supported (Llama uses silu)", c.HiddenAct)
	}
	if (c.AttentionBias && c.ModelType != "glm4_moe") || c.MLPBias {
		return bad("attention_bias / mlp_bias are not supported")
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if err := hfRopeParameters(&c); err != nil {
		return bad("%v", err)
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	s := bridge.ModelShape{NumLayers: c.NumHiddenLayers, HiddenSize: c.HiddenSize, NumHeads: c.NumAttentionHeads,
		NumKVHeads: c.NumKeyValueHeads, IntermediateSize: c.IntermediateSize, VocabSize: c.VocabSize,
		RopeTheta: float32(c.RopeTheta), RMSEps: float32(c.RMSNormEps), TiedEmbeddings: c.TieWordEmbeddings}
	if c.NumAttentionHeads > 0 {
		s.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	qwen3 := c.ModelType == "qwen3" || c.ModelType == "qwen3_moe"
	if c.HeadDim != 0 && (qwen3 || c.ModelType == "llama" || c.ModelType == "mistral" || c.ModelType == "glm4_moe") {
		s.HeadDim = c.HeadDim // the heads need not tile the hidden size (Qwen3, Mistral NeMo)
	}
	if c.ModelType == "granite" {
		s.EmbeddingScale, s.ResidualScale = float32(c.EmbeddingMultiplier), float32(c.ResidualMultiplier)
		s.AttentionScale, s.LogitScale = float32(c.AttentionMultiplier), float32(c.LogitsScaling)
	} else if c.EmbeddingMultiplier != 0 || c.ResidualMultiplier != 0 || c.AttentionMultiplier != 0 || c.LogitsScaling != 0 {
		return bad("embedding_multiplier, residual_multiplier, attention_multiplier and logits_scaling are Granite's (model_type granite), not %s's", c.ModelType)
	}
	if c.ModelType != "glm4_moe" { // (glm.go reads it after its head_dim)
		if err := hfPartialRotary(&c, &s); err != nil {
			return bad("%v", err)
		}
	}
	if (c.ModelType == "mistral" || c.ModelType == "phi3") && len(c.SlidingWindow) > 0 && string(c.SlidingWindow) != "null" {
		// Mistral 7B v0.1 attends to the last 4096 positions only, Phi-3
		// mini 4k to the last 2047, on every layer; later versions set no
		// window. A window no shorter than the context changes nothing.
		var w int
		if err := json.Unmarshal(c.SlidingWindow, &w); err != nil || w <= 0 {
			return bad("sliding_window %s is not a positive integer", c.SlidingWindow)
		}
		if c.MaxPositionEmbeddings <= 0 || w < c.MaxPositionEmbeddings {
			s.SlidingWindow = w
		}
	}
	s.QKNorm = qwen3
	// Qwen2's q, k and v projections always carry a bias (its config has
	// no switch for it); sliding-window attention is off unless
	// use_sliding_window is set, which is refused.
	if c.ModelType == "qwen2" {
		if c.UseSlidingWindow {
			return bad("use_sliding_window true: sliding-window attention is not supported")
		}
		s.QKVBias = true
	}
	if hfGemma(c.ModelType) {
		if err := hfGemmaShape(&c, &s); err != nil {
			return bad("%v", err)
		}
	}
	if c.HeadDim != 0 && c.HeadDim != s.HeadDim {
		return bad("head_dim %d differs from hidden_size / num_attention_heads = %d (not supported)", c.HeadDim, s.HeadDim)
	}
	if err := hfMoE(&c, &s); err != nil {
		return bad("%v", err)
	}
	if hfDeepSeek(c.ModelType) {
		if err := hfDeepSeekShape(&c, &s); err != nil {
			return bad("%v", err)
		}
	}
	if c.ModelType == "glm4_moe" {
		if err := hfGlm4MoeShape(&c, &s); err != nil {
			return bad("%v", err)
		}
	}
	if len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null" {
		var r struct {
			RopeType       string   `json:"rope_type"`
			Type           string   `json:"type"`
			Factor         float32  `json:"factor"`
			LowFreqFactor  float32  `json:"low_freq_factor"`
			HighFreqFactor float32  `json:"high_freq_factor"`
			Original       int      `json:"original_max_position_embeddings"`
			BetaFast       *float32 `json:"beta_fast"`
			BetaSlow       *float32 `json:"beta_slow"`
			MScale         *float32 `json:"mscale"`
			MScaleAllDim   *float32 `json:"mscale_all_dim"`
		}
		if err := json.Unmarshal(c.RopeScaling, &r); err != nil {
			return bad("rope_scaling: %v", err)
		}
		t := r.RopeType
		if t == "" {
			t = r.Type
		}
		switch t {
		case "default", "":
		case "longrope", "su":
			if err := hfLongRoPE(&c, &s); err != nil {
				return bad("%v", err)
			}
		case "linear":
			// positions / factor (Gemma 3 4B and up: on its global layers)
			if s.SlidingWindow > 0 && c.ModelType != "gemma3_text" {
				return bad("rope_scaling type \"linear\" with sliding-window layers is supported for gemma3_text only")
			}
			s.RopeLinearFactor = r.Factor
		case "llama3":
			s.RopeScaling = &bridge.RopeScaling{Factor: r.Factor, LowFreqFactor: r.LowFreqFactor,
				HighFreqFactor: r.HighFreqFactor, OriginalMaxPositions: r.Original}
		case "yarn":
			if !hfDeepSeek(c.ModelType) {
				return bad("rope_scaling type \"yarn\" is supported for DeepSeek models only (deepseek_v2, deepseek_v3, kimi_k2)")
			}
			// DeepSeek's defaults (modeling_deepseek.py's DeepseekV2YarnRotaryEmbedding).
			y := &bridge.YarnScaling{Factor: r.Factor, OriginalMaxPositions: r.Original, BetaFast: 32, BetaSlow: 1, MScale: 1}
			for _, f := range []struct {
				v   *float32
				dst *float32
			}{{r.BetaFast, &y.BetaFast}, {r.BetaSlow, &y.BetaSlow}, {r.MScale, &y.MScale}, {r.MScaleAllDim, &y.MScaleAllDim}} {
				if f.v != nil {
					*f.dst = *f.v
				}
			}
			s.Yarn = y
		default:
			return bad("rope_scaling type %q is not supported (supported: linear, llama3; longrope for phi3; yarn for DeepSeek models)", t)
		}
	}
	if err := s.Validate(); err != nil {
		return bad("%v", err)
	}
	return s, c, nil
}

// hfMoE reads the mixture-of-experts fields of a qwen3_moe or mixtral
// config into s, refusing what the engine does not compute: sliding-window
// attention, dense layers among the sparse ones, shared experts, and
// Qwen3-MoE without norm_topk_prob (its weights would not be renormalised).
func hfMoE(c *hfModelConfig, s *bridge.ModelShape) error {
	if c.UseSlidingWindow || len(c.SlidingWindow) > 0 && string(c.SlidingWindow) != "null" && c.ModelType == "mixtral" {
		return fmt.Errorf("sliding_window %s: sliding-window attention is not supported", c.SlidingWindow)
	}
	switch c.ModelType {
	case "qwen3_moe":
		if c.NormTopKProb == nil || !*c.NormTopKProb {
			return fmt.Errorf("norm_topk_prob false: router weights without renormalisation over the top-k are not supported")
		}
		if c.DecoderSparseStep > 1 || len(c.MLPOnlyLayers) > 0 {
			return fmt.Errorf("decoder_sparse_step %d / mlp_only_layers %v: dense layers among the MoE layers are not supported", c.DecoderSparseStep, c.MLPOnlyLayers)
		}
		if c.SharedExpertSize > 0 {
			return fmt.Errorf("shared_expert_intermediate_size %d: shared experts are not supported for qwen3_moe", c.SharedExpertSize)
		}
		s.NumExperts, s.MoEIntermediateSize, s.RouterNorm = c.NumExperts, c.MoEIntermediateSize, bridge.RouterSoftmaxTopK
	case "mixtral":
		s.NumExperts, s.MoEIntermediateSize, s.RouterNorm = c.NumLocalExperts, c.IntermediateSize, bridge.RouterTopKSoftmax
	default:
		return nil
	}
	if s.NumExperts <= 0 {
		return fmt.Errorf("%s without experts (num_experts / num_local_experts %d)", c.ModelType, s.NumExperts)
	}
	s.NumExpertsPerTok = c.NumExpertsPerTok
	return nil
}

// hfDeepSeekShape reads DeepSeek's latent attention, leading dense layers
// and router (scoring_func, topk_method with n_group/topk_group,
// norm_topk_prob, routed_scaling_factor), refusing what the engine does not
// compute: FP8 block-quantised checkpoints and MoE layers at a stride.
func hfDeepSeekShape(c *hfModelConfig, s *bridge.ModelShape) error {
	if len(c.QuantizationConfig) > 0 && string(c.QuantizationConfig) != "null" {
		return fmt.Errorf("quantization_config %s: quantised DeepSeek checkpoints (FP8 with block scales) are not supported; dequantise to BF16 first", c.QuantizationConfig)
	}
	if c.MoELayerFreq != nil && *c.MoELayerFreq != 1 {
		return fmt.Errorf("moe_layer_freq %d: MoE layers at a stride are not supported (1: every layer after first_k_dense_replace)", *c.MoELayerFreq)
	}
	if c.QLoraRank != nil {
		s.QLoraRank = *c.QLoraRank
	}
	s.KVLoraRank, s.QKNopeHeadDim, s.QKRopeHeadDim, s.VHeadDim = c.KVLoraRank, c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim
	s.HeadDim = c.QKNopeHeadDim + c.QKRopeHeadDim
	s.NumKVHeads = s.NumHeads
	return hfDeepSeekMoE(c, s)
}

// hfDeepSeekMoE reads DeepSeek's mixture-of-experts fields (the ones GLM-4.5
// shares): leading dense layers, routed and shared experts, the router's
// scoring, top-k method with groups, renormalisation and scaling.
func hfDeepSeekMoE(c *hfModelConfig, s *bridge.ModelShape) error {
	if c.NRoutedExperts == 0 {
		return nil // a dense model
	}
	s.NumExperts, s.NumExpertsPerTok, s.MoEIntermediateSize = c.NRoutedExperts, c.NumExpertsPerTok, c.MoEIntermediateSize
	s.NumSharedExperts, s.FirstDenseLayers = c.NSharedExperts, c.FirstKDenseReplace
	s.RoutedScalingFactor = float32(c.RoutedScaling)
	norm := c.NormTopKProb != nil && *c.NormTopKProb
	switch {
	case c.ScoringFunc == "" || c.ScoringFunc == "softmax":
		s.RouterNorm = map[bool]bridge.RouterNorm{true: bridge.RouterSoftmaxTopK, false: bridge.RouterSoftmaxTopKRaw}[norm]
	case c.ScoringFunc == "sigmoid":
		s.RouterNorm = map[bool]bridge.RouterNorm{true: bridge.RouterSigmoidTopK, false: bridge.RouterSigmoidTopKRaw}[norm]
	default:
		return fmt.Errorf("scoring_func %q is not supported (softmax, sigmoid)", c.ScoringFunc)
	}
	switch c.TopKMethod {
	case "", "greedy":
	case "group_limited_greedy", "noaux_tc":
		if (c.TopKMethod == "noaux_tc") != s.RouterNorm.Sigmoid() {
			return fmt.Errorf("topk_method %q with scoring_func %q is not supported (noaux_tc goes with sigmoid, group_limited_greedy with softmax)", c.TopKMethod, c.ScoringFunc)
		}
		if c.NGroup > 1 {
			s.ExpertGroups, s.ExpertGroupsUsed = c.NGroup, c.TopKGroup
		}
	default:
		return fmt.Errorf("topk_method %q is not supported (greedy, group_limited_greedy, noaux_tc)", c.TopKMethod)
	}
	return nil
}

// safetensorsFiles lists the weight files: the shards of
// model.safetensors.index.json, else model.safetensors, else every
// *.safetensors file.
func safetensorsFiles(dir string) ([]string, error) {
	if raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &idx); err != nil {
			return nil, fmt.Errorf("model.safetensors.index.json: %w", err)
		}
		set := map[string]bool{}
		for _, f := range idx.WeightMap {
			if filepath.Base(f) != f {
				return nil, fmt.Errorf("model.safetensors.index.json: shard %q is not a file name in the directory", f)
			}
			set[f] = true
		}
		files := make([]string, 0, len(set))
		for f := range set {
			files = append(files, f)
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("model.safetensors.index.json has an empty weight_map")
		}
		return files, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		return []string{"model.safetensors"}, nil
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(matches) == 0 {
		return nil, fmt.Errorf("no *.safetensors files")
	}
	files := make([]string, len(matches))
	for i, m := range matches {
		files[i] = filepath.Base(m)
	}
	sort.Strings(files)
	return files, nil
}

func loadHF(dir string) (m *Model, err error) {
	shape, cfg, err := hfShape(dir)
	if err != nil {
		return nil, err
	}
	tok, err := LoadHFTokenizer(dir)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", dir, err)
	}
	if tok.VocabSize() > shape.VocabSize {
		return nil, fmt.Errorf("model %s: the tokenizer has %d tokens, more than config.json's vocab_size %d", dir, tok.VocabSize(), shape.VocabSize)
	}
	files, err := safetensorsFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", dir, err)
	}
	name := cfg.NameOrPath
	if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}
	m = &Model{Path: dir, Format: "safetensors", Name: name, Shape: shape, ContextLength: cfg.MaxPositionEmbeddings, Tokenizer: tok}
	// Unmap on failure. The model is passed in: by the time this runs, an
	// error return has already set m to nil.
	defer func(partial *Model) {
		if err != nil {
			partial.Close()
			m = nil
		}
	}(m)
	for _, file := range files {
		path := filepath.Join(dir, file)
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", dir, err)
		}
		mm, err := mmap.Map(f, mmap.RDONLY, 0)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("model %s: mapping %s: %w", dir, file, err)
		}
		m.mappings = append(m.mappings, closerFunc(mm.Unmap))
		st, err := safetensors.Deserialize(mm)
		if err != nil {
			return nil, fmt.Errorf("model %s: %s: %w", dir, file, err)
		}
		for _, nt := range st.Tensors() {
			name, tv := nt.Name, nt.TensorView
			if cfg.multimodal {
				var skip bool
				if name, skip = gemma3TextName(name); skip {
					continue // the vision tower: this loader serves text
				}
			}
			if sm := hfAnyLayer.FindStringSubmatch(name); sm != nil && cfg.NumNextnPredictLayers > 0 {
				if l := atoi(sm[1]); l >= shape.NumLayers && l < shape.NumLayers+cfg.NumNextnPredictLayers {
					continue // a multi-token-prediction layer (GLM-4.5; model/glm.go)
				}
			}
			kind, layer, expert := bridge.WeightKind(-1), -1, 0
			if k, ok := hfGlobalTensor[name]; ok {
				kind = k
			} else if sm := hfRouterBias.FindStringSubmatch(name); sm != nil {
				kind, layer = bridge.WeightRouterBias, atoi(sm[1])
				if layer >= shape.NumLayers {
					return nil, fmt.Errorf("model %s: %s: tensor %s: layer out of range (%d layers)", dir, file, name, shape.NumLayers)
				}
			} else if sm := hfProjBias.FindStringSubmatch(name); sm != nil && shape.QKVBias {
				kind, layer = projBiasKind[sm[2]], atoi(sm[1])
				if layer >= shape.NumLayers {
					return nil, fmt.Errorf("model %s: %s: tensor %s: layer out of range (%d layers)", dir, file, name, shape.NumLayers)
				}
			} else if sm := hfLayerName.FindStringSubmatch(name); sm != nil {
				k, ok := hfLayerTensor[sm[2]]
				if gk, gemma := hfGemmaLayerTensor[sm[2]]; gemma && shape.PostNorms {
					k, ok = gk, true
				}
				l, _ := strconv.Atoi(sm[1])
				if em := hfExpertName.FindStringSubmatch(sm[2]); em != nil {
					e, part := em[1]+em[3], em[2]+em[4]
					expert, _ = strconv.Atoi(e)
					k, ok = hfExpertKind[part], expert < shape.NumExperts
				}
				if !ok || l >= shape.NumLayers {
					return nil, fmt.Errorf("model %s: %s: tensor %s is not part of a %s decoder this loader reads (unsupported architecture variant)", dir, file, name, cfg.ModelType)
				}
				kind, layer = k, l
			} else if hfRotaryFreqs.MatchString(name) {
				continue // derived, recomputed by the engine
			} else {
				return nil, fmt.Errorf("model %s: %s: tensor %s is not part of a %s decoder this loader reads (unsupported architecture variant)", dir, file, name, cfg.ModelType)
			}
			if kind == bridge.WeightLMHead && shape.TiedEmbeddings {
				continue // tied: the embedding serves as the output projection
			}
			dt, ok := safetensorsTypes[tv.DType()]
			if !ok {
				return nil, fmt.Errorf("model %s: %s: tensor %s has dtype %v; supported: F32, F16, BF16", dir, file, name, tv.DType())
			}
			sh := tv.Shape()
			var rows, cols int64
			switch len(sh) {
			case 1:
				rows, cols = 1, int64(sh[0])
			case 2:
				rows, cols = int64(sh[0]), int64(sh[1])
			default:
				return nil, fmt.Errorf("model %s: %s: tensor %s has %d dimensions, want 1 or 2", dir, file, name, len(sh))
			}
			w := bridge.WeightTensor{Name: name, Kind: kind, Layer: layer, Expert: expert, DType: dt,
				Rows: rows, Cols: cols, Data: tv.Data()}
			if kind == weightQKV || kind == weightGateUp {
				parts, err := splitFused(shape, w)
				if err != nil {
					return nil, fmt.Errorf("model %s: %s: %w", dir, file, err)
				}
				m.Tensors = append(m.Tensors, parts...)
				continue
			}
			// DeepSeek's checkpoints keep the rope tails of q and of the
			// latent projection in adjacent-pair order (the modeling code
			// de-interleaves them at run time); the engine restores
			// rotate-half order.
			if shape.MLA() && kind == bridge.WeightQ {
				w.InterleavedRopeHeads = shape.NumHeads
			} else if shape.MLA() && kind == bridge.WeightKVA {
				w.InterleavedRopeHeads = 1
			}
			m.Tensors = append(m.Tensors, w)
		}
	}
	if cfg.ropeFactors != nil {
		m.Tensors = append(m.Tensors, *cfg.ropeFactors)
	}
	if hfGemma(cfg.ModelType) {
		if err := gemmaNormGains(m.Tensors); err != nil {
			return nil, fmt.Errorf("model %s: %w", dir, err)
		}
	}
	if err := checkTensors(shape, m.Tensors); err != nil {
		return nil, fmt.Errorf("model %s: %w", dir, err)
	}
	return m, nil
}
