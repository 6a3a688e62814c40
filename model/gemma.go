package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Gemma's decoders (docs/models.md "Gemma"): Gemma 1 (GELU MLP, embedding
// times sqrt(hidden)), Gemma 2 (and post norms, soft-capping, sliding
// windows on every other layer) and Gemma 3's text decoder (and q/k norms,
// a window on five layers of six with their own RoPE base, linear RoPE
// scaling of the global layers, no soft-capping).

// gemmaScales sets the multipliers every Gemma has: the embedding times
// sqrt(hidden) (rounded to float as llama.cpp's sqrtf and Hugging Face's
// float32 normalizer do), and for Gemma 2 and 3 at 27B the attention scale
// of query_pre_attn_scalar = hidden / heads instead of head_dim.
func gemmaScales(shape *bridge.ModelShape, queryPreAttnScalar float64) {
	shape.MLPGelu = true
	shape.EmbeddingScale = float32(math.Sqrt(float64(shape.HiddenSize)))
	if queryPreAttnScalar > 0 && queryPreAttnScalar != float64(shape.HeadDim) {
		shape.AttentionScale = float32(1 / math.Sqrt(queryPreAttnScalar))
	}
}

// ggufGemma reads a gemma, gemma2 or gemma3 file's own metadata into shape
// (after the common keys), as llama.cpp's loader reads it: its defaults
// (soft caps 50 and 30, a 4096 window for Gemma 2, local RoPE base 10000
// for Gemma 3) and its rule for the 27B models' attention scale (the layer
// count: 46 for Gemma 2, 62 for Gemma 3).
func ggufGemma(path, arch string, num func(string, float64, bool) (float64, error), kvs gguf.GGUFMetadataKVs, shape *bridge.ModelShape) error {
	pre := 0.0
	if (arch == "gemma2" && shape.NumLayers == 46) || (arch == "gemma3" && shape.NumLayers == 62) {
		pre = float64(shape.HiddenSize / shape.NumHeads)
	}
	gemmaScales(shape, pre)
	if arch == "gemma" {
		return nil
	}
	shape.PostNorms = true
	shape.QKNorm = arch == "gemma3"
	caps := []struct {
		key string
		def float64
		dst *float32
	}{{"final_logit_softcapping", 0, &shape.FinalSoftcap}}
	window, pattern, localTheta := 0.0, 6.0, 10000.0
	if arch == "gemma2" {
		caps = []struct {
			key string
			def float64
			dst *float32
		}{{"attn_logit_softcapping", 50, &shape.AttnSoftcap}, {"final_logit_softcapping", 30, &shape.FinalSoftcap}}
		window, pattern, localTheta = 4096, 2, float64(shape.RopeTheta)
	}
	for _, c := range caps {
		v, err := num(c.key, c.def, false)
		if err != nil {
			return err
		}
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a non-negative number", path, arch, c.key, v)
		}
		*c.dst = float32(v)
	}
	w, err := num("attention.sliding_window", window, false)
	if err != nil {
		return err
	}
	if w != float64(int32(w)) || w < 0 {
		return fmt.Errorf("model %s: GGUF metadata %s.attention.sliding_window = %v is not a non-negative integer", path, arch, w)
	}
	if w == 0 {
		return nil // (Gemma 3 without the key: every layer global)
	}
	p, err := ggufSlidingPattern(path, arch, kvs, int(pattern), shape.NumLayers)
	if err != nil || p < 0 {
		return err
	}
	shape.SlidingWindow, shape.SlidingWindowPattern = int(w), p
	lt, err := num("rope.freq_base_swa", localTheta, false)
	if err != nil {
		return err
	}
	if !(lt > 0) || math.IsInf(lt, 0) {
		return fmt.Errorf("model %s: GGUF metadata %s.rope.freq_base_swa = %v is not a positive number", path, arch, lt)
	}
	if float32(lt) != shape.RopeTheta {
		shape.RopeLocalTheta = float32(lt)
	}
	return nil
}

// ggufSlidingPattern reads attention.sliding_window_pattern: a number p
// (llama.cpp's set_swa_pattern: layer l slides when l % p < p - 1; 0 =
// every layer) or an array of one flag per layer (true = sliding), which
// must be such a pattern. It returns the engine's pattern, or -1 when no
// layer slides.
func ggufSlidingPattern(path, arch string, kvs gguf.GGUFMetadataKVs, def, layers int) (int, error) {
	key := arch + ".attention.sliding_window_pattern"
	kv, ok := kvs.Get(key)
	if !ok {
		return enginePattern(def), nil
	}
	if kv.ValueType.IsNumeric() {
		p := gguf.ValueNumeric[float64](kv)
		if p != float64(int32(p)) || p < 0 {
			return 0, fmt.Errorf("model %s: GGUF metadata %s = %v is not a non-negative integer", path, key, p)
		}
		return enginePattern(int(p)), nil
	}
	if kv.ValueType != gguf.GGUFMetadataValueTypeArray {
		return 0, fmt.Errorf("model %s: GGUF metadata %s is a %v, want a number or an array of flags", path, key, kv.ValueType)
	}
	av := kv.ValueArray()
	if av.Type != gguf.GGUFMetadataValueTypeBool || len(av.Array) != layers {
		return 0, fmt.Errorf("model %s: GGUF metadata %s is an array of %d %v, want one bool per layer (%d)", path, key, len(av.Array), av.Type, layers)
	}
	sliding := make([]bool, layers)
	for i, v := range av.Array {
		sliding[i], _ = v.(bool)
	}
	for _, p := range append([]int{0, 1}, seq(2, layers+1)...) {
		match := true
		for l, s := range sliding {
			if s != (p == 0 || l%p < p-1) {
				match = false
				break
			}
		}
		if match {
			return enginePattern(p), nil
		}
	}
	return 0, fmt.Errorf("model %s: GGUF metadata %s gives sliding layers %v; supported: every layer, or all but each p-th", path, key, sliding)
}

// enginePattern is llama.cpp's pattern p in the engine's terms (engine.h
// sliding_window_pattern): the same p, and -1 for p 1 (no layer slides).
func enginePattern(p int) int {
	if p == 1 {
		return -1
	}
	return p
}

// seq is [a, b].
func seq(a, b int) []int {
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}

// hfGemma reports whether a config.json model_type is a Gemma decoder.
func hfGemma(t string) bool { return t == "gemma" || t == "gemma2" || t == "gemma3_text" }

// hfGemmaLayerTensor are the layer tensors whose names mean something else
// in Gemma 2 and 3 than in Llama: post_attention_layernorm is the attention
// output's norm there, pre_feedforward_layernorm the MLP's input norm.
var hfGemmaLayerTensor = map[string]bridge.WeightKind{
	"post_attention_layernorm": bridge.WeightAttnPostNorm, "pre_feedforward_layernorm": bridge.WeightMLPNorm,
	"post_feedforward_layernorm": bridge.WeightMLPPostNorm,
}

// hfGemmaShape reads a gemma, gemma2 or gemma3_text config.json's own
// fields into s (transformers' defaults where a field is absent).
func hfGemmaShape(c *hfModelConfig, s *bridge.ModelShape) error {
	for _, act := range []string{c.HiddenAct, c.HiddenActivation} {
		if act != "" && act != "gelu_pytorch_tanh" && act != "gelu" {
			// (Gemma 1's configs say "gelu"; transformers and llama.cpp run its tanh form.)
			return fmt.Errorf("hidden_activation %q is not supported (Gemma uses gelu_pytorch_tanh)", act)
		}
	}
	if c.HeadDim != 0 {
		s.HeadDim = c.HeadDim
	}
	pre := 0.0
	if c.QueryPreAttnScalar != nil {
		pre = *c.QueryPreAttnScalar
		if !(pre > 0) || math.IsInf(pre, 0) {
			return fmt.Errorf("query_pre_attn_scalar %v is not a positive number", pre)
		}
	}
	gemmaScales(s, pre)
	if c.ModelType == "gemma" {
		return nil
	}
	s.PostNorms, s.QKNorm = true, c.ModelType == "gemma3_text"
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		def  float64
		dst  *float32
	}{{"attn_logit_softcapping", c.AttnLogitSoftcapping, 50, &s.AttnSoftcap}, {"final_logit_softcapping", c.FinalLogitSoftcapping, 30, &s.FinalSoftcap}} {
		v := f.def
		if c.ModelType == "gemma3_text" {
			v = 0 // Gemma 3: none unless the config sets one
		}
		if len(f.raw) > 0 {
			v = 0 // present: null means none
			if string(f.raw) != "null" {
				if err := json.Unmarshal(f.raw, &v); err != nil {
					return fmt.Errorf("%s %s is not a number", f.name, f.raw)
				}
			}
		}
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s %v is not a non-negative number", f.name, v)
		}
		*f.dst = float32(v)
	}
	var w int
	if len(c.SlidingWindow) > 0 && string(c.SlidingWindow) != "null" {
		if err := json.Unmarshal(c.SlidingWindow, &w); err != nil || w < 0 {
			return fmt.Errorf("sliding_window %s is not a non-negative integer", c.SlidingWindow)
		}
	}
	if w == 0 {
		return nil
	}
	pattern := 2
	if c.ModelType == "gemma3_text" {
		pattern = 6
		if c.SlidingWindowPattern != 0 {
			pattern = c.SlidingWindowPattern
		}
	}
	if len(c.LayerTypes) > 0 {
		p, err := layerTypesPattern(c.LayerTypes, s.NumLayers)
		if err != nil {
			return err
		}
		pattern = p
	}
	if pattern < 0 {
		return nil
	}
	s.SlidingWindow, s.SlidingWindowPattern = w, enginePattern(pattern)
	if s.SlidingWindowPattern < 0 {
		s.SlidingWindow, s.SlidingWindowPattern = 0, 0
		return nil
	}
	if c.ModelType == "gemma3_text" {
		local := 10000.0
		if c.RopeLocalBaseFreq != 0 {
			local = c.RopeLocalBaseFreq
		}
		if float32(local) != s.RopeTheta {
			s.RopeLocalTheta = float32(local)
		}
	}
	return nil
}

// layerTypesPattern reads transformers' layer_types ("sliding_attention" /
// "full_attention" per layer) as llama.cpp's pattern: 0 = every layer
// slides, p = all but each p-th, -1 = none.
func layerTypesPattern(types []string, layers int) (int, error) {
	if len(types) != layers {
		return 0, fmt.Errorf("layer_types has %d entries for %d layers", len(types), layers)
	}
	sliding := make([]bool, layers)
	any := false
	for i, t := range types {
		switch t {
		case "sliding_attention":
			sliding[i], any = true, true
		case "full_attention":
		default:
			return 0, fmt.Errorf("layer_types[%d] %q is not supported (sliding_attention, full_attention)", i, t)
		}
	}
	if !any {
		return -1, nil
	}
	for _, p := range append([]int{0}, seq(2, layers+1)...) {
		match := true
		for l, sl := range sliding {
			if sl != (p == 0 || l%p < p-1) {
				match = false
				break
			}
		}
		if match {
			return p, nil
		}
	}
	return 0, fmt.Errorf("layer_types %v: supported are every layer sliding, or all but each p-th", types)
}

// gemmaNormGains turns a Gemma checkpoint's RMSNorm weights w into the
// gains the engine multiplies by, 1 + w in float32 (Hugging Face's
// Gemma RMSNorm computes x · (1 + w.float())); llama.cpp's converter
// stores them so already.
func gemmaNormGains(ts []bridge.WeightTensor) error {
	for i := range ts {
		switch ts[i].Kind {
		case bridge.WeightAttnNorm, bridge.WeightMLPNorm, bridge.WeightFinalNorm, bridge.WeightAttnPostNorm,
			bridge.WeightMLPPostNorm, bridge.WeightQNorm, bridge.WeightKNorm:
		default:
			continue
		}
		t := &ts[i]
		n := t.Rows * t.Cols
		rb, err := t.DType.RowBytes(t.Cols)
		if err != nil || int64(len(t.Data)) != rb*t.Rows {
			continue // checkTensors names it
		}
		out := make([]byte, 4*n)
		for j := int64(0); j < n; j++ {
			var w float32
			switch t.DType {
			case bridge.DTypeF32:
				w = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*j:]))
			case bridge.DTypeBF16:
				w = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*j:])) << 16)
			case bridge.DTypeF16:
				w = halfToFloat(binary.LittleEndian.Uint16(t.Data[2*j:]))
			default:
				return fmt.Errorf("tensor %s: a Gemma norm weight in %s; want F32, F16 or BF16", t.Name, t.DType)
			}
			binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(1+w))
		}
		t.DType, t.Data = bridge.DTypeF32, out
	}
	return nil
}

// halfToFloat converts an IEEE binary16 value exactly.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: man · 2^-24, exact in float32.
	v := float32(man) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// Gemma 3 4B, 12B and 27B ship as Gemma3ForConditionalGeneration (config
// model_type gemma3): the text decoder's config is text_config, its
// weights are language_model.model.* (transformers 5 saves
// model.language_model.*), beside a vision tower and projector that this
// loader skips: the text decoder serves text. transformers fills the
// fields text_config leaves out from Gemma3TextConfig's defaults, so this
// does too.

// gemma3TextDefaults is transformers' Gemma3TextConfig() as JSON.
const gemma3TextDefaults = `{"model_type":"gemma3_text","vocab_size":262208,"hidden_size":2304,"intermediate_size":9216,` +
	`"num_hidden_layers":26,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,"max_position_embeddings":131072,` +
	`"rms_norm_eps":1e-6,"rope_theta":1000000.0,"query_pre_attn_scalar":256,"sliding_window":4096,` +
	`"rope_local_base_freq":10000.0,"sliding_window_pattern":6,"tie_word_embeddings":true,"hidden_activation":"gelu_pytorch_tanh"}`

// hfGemma3Text reads a gemma3_text config (raw, the whole file's or a
// gemma3 file's text_config) over Gemma3TextConfig's defaults into c.
func hfGemma3Text(raw []byte, c *hfModelConfig) error {
	var d hfModelConfig
	if err := json.Unmarshal([]byte(gemma3TextDefaults), &d); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return err
	}
	var given map[string]json.RawMessage
	if err := json.Unmarshal(raw, &given); err != nil {
		return err
	}
	if _, ok := given["rope_parameters"]; ok {
		// transformers 5's form: its bases are in rope_parameters, not
		// in the 4.x defaults.
		if _, ok := given["rope_theta"]; !ok {
			d.RopeTheta = 0
		}
		if _, ok := given["rope_local_base_freq"]; !ok {
			d.RopeLocalBaseFreq = 0
		}
	}
	if d.ModelType != "gemma3_text" {
		return fmt.Errorf("text_config.model_type %q, want gemma3_text", d.ModelType)
	}
	*c = d
	return nil
}

// hfGemma3Multimodal reads a gemma3 (Gemma3ForConditionalGeneration)
// config: its text_config over the defaults, its top-level name kept.
func hfGemma3Multimodal(raw []byte, c *hfModelConfig) error {
	var top struct {
		TextConfig json.RawMessage `json:"text_config"`
		NameOrPath string          `json:"_name_or_path"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return err
	}
	if !notNull(top.TextConfig) {
		return fmt.Errorf("model_type gemma3 without a text_config")
	}
	if err := hfGemma3Text(top.TextConfig, c); err != nil {
		return err
	}
	c.multimodal = true
	if c.NameOrPath == "" {
		c.NameOrPath = top.NameOrPath
	}
	return nil
}

// gemma3TextName maps a Gemma3ForConditionalGeneration tensor to the text
// decoder's name; skip: a vision tower's or projector's tensor.
func gemma3TextName(name string) (out string, skip bool) {
	for _, p := range []string{"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."} {
		if strings.HasPrefix(name, p) {
			return "", true
		}
	}
	for _, p := range [][2]string{{"language_model.model.", "model."}, {"model.language_model.", "model."}, {"language_model.lm_head.", "lm_head."}} {
		if strings.HasPrefix(name, p[0]) {
			return p[1] + strings.TrimPrefix(name, p[0]), false
		}
	}
	return name, false
}
