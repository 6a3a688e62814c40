package model

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/edsrzf/mmap-go"
	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/lockstep-ai/lockstep/bridge"
)

// ggufLayerTensor maps blk.N.<name>.weight to a weight kind.
var ggufLayerTensor = map[string]bridge.WeightKind{
	"attn_norm": bridge.WeightAttnNorm, "attn_q": bridge.WeightQ, "attn_k": bridge.WeightK,
	"attn_v": bridge.WeightV, "attn_output": bridge.WeightO, "ffn_norm": bridge.WeightMLPNorm,
	"ffn_gate": bridge.WeightGate, "ffn_up": bridge.WeightUp, "ffn_down": bridge.WeightDown,
	"attn_q_norm": bridge.WeightQNorm, "attn_k_norm": bridge.WeightKNorm, "ffn_gate_inp": bridge.WeightRouter,
	"ffn_gate_shexp": bridge.WeightSharedGate, "ffn_up_shexp": bridge.WeightSharedUp, "ffn_down_shexp": bridge.WeightSharedDown,
	// deepseek2 (MLA): attn_q_b is the q projection after the q LoRA;
	// attn_k_b / attn_v_b are 3-D ([heads][kv_lora][nope], [heads][v][kv_lora]),
	// read as their [heads·rows][cols] matrices.
	"attn_q_a": bridge.WeightQA, "attn_q_a_norm": bridge.WeightQANorm, "attn_q_b": bridge.WeightQ,
	"attn_kv_a_mqa": bridge.WeightKVA, "attn_kv_a_norm": bridge.WeightKVANorm, "attn_kv_b": bridge.WeightKVB,
	"attn_k_b": bridge.WeightKB, "attn_v_b": bridge.WeightVB,
	// phi3: q, k and v in one projection (split by rows on load).
	"attn_qkv": weightQKV,
	// gemma2, gemma3: the attention and MLP outputs' norms.
	"post_attention_norm": bridge.WeightAttnPostNorm, "post_ffw_norm": bridge.WeightMLPPostNorm,
}

// weightQKV marks a fused q/k/v projection (phi3's attn_qkv, Hugging
// Face's qkv_proj) and weightGateUp a fused gate/up one (phi3's ffn_up of
// twice the width, gate_up_proj), which the loaders split by rows into
// the engine's kinds (splitFused).
const (
	weightQKV    bridge.WeightKind = -2
	weightGateUp bridge.WeightKind = -3
)

// ggufStackedExperts are the 3-D expert tensors, [experts][rows][cols]
// (GGUF dimensions cols, rows, experts), sliced into one tensor per expert.
var ggufStackedExperts = map[string]bridge.WeightKind{
	"ffn_gate_exps": bridge.WeightExpertGate, "ffn_up_exps": bridge.WeightExpertUp, "ffn_down_exps": bridge.WeightExpertDown,
}

// blkExpertTensor is the per-expert 2-D form of older Mixtral GGUF files:
// blk.N.ffn_{gate,up,down}.E.weight.
var blkExpertTensor = regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$`)

// ggufLongRoPE are LongRoPE's two sets of RoPE divisors (Phi-3.5,
// Phi-4-mini), by the contexts they serve.
var ggufLongRoPE = map[string]string{"rope_factors_long.weight": "long", "rope_factors_short.weight": "short"}

var ggufGlobalTensor = map[string]bridge.WeightKind{
	"token_embd.weight": bridge.WeightEmbedding, "output_norm.weight": bridge.WeightFinalNorm,
	"output.weight": bridge.WeightLMHead,
}

var ggufTypes = map[gguf.GGMLType]bridge.DType{
	gguf.GGMLTypeF32: bridge.DTypeF32, gguf.GGMLTypeF16: bridge.DTypeF16, gguf.GGMLTypeBF16: bridge.DTypeBF16,
	gguf.GGMLTypeQ8_0: bridge.DTypeQ8_0, gguf.GGMLTypeQ4_0: bridge.DTypeQ4_0, gguf.GGMLTypeQ4_1: bridge.DTypeQ4_1,
	gguf.GGMLTypeQ5_0: bridge.DTypeQ5_0, gguf.GGMLTypeQ5_1: bridge.DTypeQ5_1, gguf.GGMLTypeQ2_K: bridge.DTypeQ2_K,
	gguf.GGMLTypeQ3_K: bridge.DTypeQ3_K, gguf.GGMLTypeQ4_K: bridge.DTypeQ4_K, gguf.GGMLTypeQ5_K: bridge.DTypeQ5_K,
	gguf.GGMLTypeQ6_K: bridge.DTypeQ6_K,
}

var blkTensor = regexp.MustCompile(`^blk\.(\d+)\.([a-z_]+)\.weight$`)

// blkAnyTensor is any tensor of a block: its layer and the rest.
var blkAnyTensor = regexp.MustCompile(`^blk\.(\d+)\.(.+)$`)

// blkRouterBias is deepseek2's score-correction bias of a sigmoid router.
var blkRouterBias = regexp.MustCompile(`^blk\.(\d+)\.exp_probs_b\.bias$`)

// blkProjBias is a q, k or v projection's bias (qwen2).
var blkProjBias = regexp.MustCompile(`^blk\.(\d+)\.attn_([qkv])\.bias$`)

var projBiasKind = map[string]bridge.WeightKind{"q": bridge.WeightQBias, "k": bridge.WeightKBias, "v": bridge.WeightVBias}

// ggufArchitectures are the general.architecture values this loader reads:
// Llama (dense, or with experts: Mixtral), Granite (Llama with four
// multipliers), Gemma 1-3 (model/gemma.go), Phi-3 (fused projections),
// Qwen2 (q/k/v biases), Qwen3 (q/k norms), Qwen3-MoE and DeepSeek-V2/V3
// (deepseek2: MLA, docs/models.md).
// The value says whether
// llama.cpp's converter stored Q and K rows in its interleaved RoPE order
// (it permutes them for "llama"; DeepSeek's checkpoints are interleaved
// in the rope tails of q and of the latent projection; Qwen models use its
// NeoX rotation, which is rotate-half).
var ggufArchitectures = map[string]struct{ interleaved, qkNorm, qkvBias, mla, granite, gemma, glm bool }{
	"glm4moe":   {qkvBias: true, glm: true},
	"gemma":     {gemma: true},
	"gemma2":    {gemma: true},
	"gemma3":    {gemma: true},
	"llama":     {interleaved: true},
	"granite":   {interleaved: true, granite: true},
	"phi3":      {},
	"qwen2":     {qkvBias: true},
	"qwen3":     {qkNorm: true},
	"qwen3moe":  {qkNorm: true},
	"deepseek2": {interleaved: true, mla: true},
}

// ggufArchitectureNames lists them for messages.
const ggufArchitectureNames = "deepseek2, gemma, gemma2, gemma3, glm4moe, granite, llama, phi3, qwen2, qwen3, qwen3moe"

// parseGGUF parses a GGUF file's header. The parser panics on some
// corrupt headers (a size product that overflows); that panic is the
// file's fault, so it becomes the same error as any other corruption.
func parseGGUF(path string) (gf *gguf.GGUFFile, err error) {
	defer func() {
		if r := recover(); r != nil {
			gf, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return gguf.ParseGGUFFile(path, gguf.UseMMap())
}

// maxTensorDim bounds one tensor dimension (2^40: far above any vocabulary
// or hidden size, far below an overflow of rows × row bytes).
const maxTensorDim = 1 << 40

func loadGGUF(path string) (m *Model, err error) {
	gf, err := parseGGUF(path)
	if err != nil {
		return nil, fmt.Errorf("model %s: reading GGUF (truncated or corrupt file?): %w", path, err)
	}
	kvs := gf.Header.MetadataKV
	str := func(k string) string {
		if v, ok := kvs.Get(k); ok && v.ValueType == gguf.GGUFMetadataValueTypeString {
			return v.ValueString()
		}
		return ""
	}
	arch := str("general.architecture")
	archInfo, ok := ggufArchitectures[arch]
	if !ok {
		return nil, fmt.Errorf("model %s: architecture %q is not supported (supported: %s)", path, arch, ggufArchitectureNames)
	}
	num := func(k string, def float64, required bool) (float64, error) {
		v, ok := kvs.Get(arch + "." + k)
		if !ok {
			if required {
				return 0, fmt.Errorf("model %s: GGUF metadata %s.%s is missing", path, arch, k)
			}
			return def, nil
		}
		if !v.ValueType.IsNumeric() {
			return 0, fmt.Errorf("model %s: GGUF metadata %s.%s is a %v, want a number", path, arch, k, v.ValueType)
		}
		return gguf.ValueNumeric[float64](v), nil
	}
	var shape bridge.ModelShape
	ints := []struct {
		key      string
		dst      *int
		required bool
	}{
		{"block_count", &shape.NumLayers, true},
		{"embedding_length", &shape.HiddenSize, true},
		{"feed_forward_length", &shape.IntermediateSize, true},
		{"attention.head_count", &shape.NumHeads, true},
	}
	for _, f := range ints {
		v, err := num(f.key, 0, f.required)
		if err != nil {
			return nil, err
		}
		if v != float64(int32(v)) || v <= 0 {
			return nil, fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a positive integer", path, arch, f.key, v)
		}
		*f.dst = int(v)
	}
	if archInfo.glm {
		// GLM-4.5: block_count counts the multi-token-prediction layers
		// too, which the loader skips (model/glm.go).
		nextn, err := num("nextn_predict_layers", 0, false)
		if err != nil {
			return nil, err
		}
		if nextn < 0 || nextn != float64(int32(nextn)) || int(nextn) >= shape.NumLayers {
			return nil, fmt.Errorf("model %s: GGUF metadata %s.nextn_predict_layers = %v is not a count below block_count %d", path, arch, nextn, shape.NumLayers)
		}
		shape.NumLayers -= int(nextn)
	}
	kvHeads, err := num("attention.head_count_kv", float64(shape.NumHeads), false)
	if err != nil {
		return nil, err
	}
	shape.NumKVHeads = int(kvHeads)
	if arch == "phi3" {
		// Phi-4-mini's partial rotation: rope.dimension_count is the
		// rotated part of heads of hidden / heads.
		shape.HeadDim = shape.HiddenSize / shape.NumHeads
		rd, err := num("rope.dimension_count", float64(shape.HeadDim), false)
		if err != nil {
			return nil, err
		}
		if rd != float64(int32(rd)) || rd <= 0 || int(rd) > shape.HeadDim || int(rd)%2 != 0 {
			return nil, fmt.Errorf("model %s: GGUF metadata phi3.rope.dimension_count = %v is not an even count of at most the head size %d", path, rd, shape.HeadDim)
		}
		if int(rd) < shape.HeadDim {
			shape.PartialRotaryDim = int(rd)
		}
	} else if archInfo.mla {
		if err := ggufMLA(path, arch, num, kvs, &shape); err != nil {
			return nil, err
		}
	} else if err := ggufHeadDim(path, arch, num, kvs, &shape, archInfo.glm); err != nil {
		return nil, err
	}
	if af, err := num("rope.scaling.attn_factor", 1, false); err != nil {
		return nil, err
	} else if af != 1 {
		// LongRoPE's (Phi-3.5, Phi-4-mini): cos and sin times it, as
		// llama.cpp multiplies every model's by it.
		if !(af > 0) || math.IsInf(af, 0) {
			return nil, fmt.Errorf("model %s: GGUF metadata %s.rope.scaling.attn_factor = %v is not a positive number", path, arch, af)
		}
		shape.RopeAttnFactor = float32(af)
	}
	shape.QKNorm, shape.QKVBias = archInfo.qkNorm, archInfo.qkvBias
	if archInfo.granite {
		for _, f := range []struct {
			key string
			dst *float32
		}{{"embedding_scale", &shape.EmbeddingScale}, {"residual_scale", &shape.ResidualScale},
			{"attention.scale", &shape.AttentionScale}, {"logit_scale", &shape.LogitScale}} {
			v, err := num(f.key, 0, false)
			if err != nil {
				return nil, err
			}
			if !(v >= 0) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a non-negative number", path, arch, f.key, v)
			}
			*f.dst = float32(v)
		}
	}
	theta, err := num("rope.freq_base", 10000, false)
	if err != nil {
		return nil, err
	}
	shape.RopeTheta = float32(theta)
	eps, err := num("attention.layer_norm_rms_epsilon", 0, true)
	if err != nil {
		return nil, err
	}
	shape.RMSEps = float32(eps)
	if err := ggufMoE(path, arch, num, kvs, &shape); err != nil {
		return nil, err
	}
	if archInfo.gemma {
		if err := ggufGemma(path, arch, num, kvs, &shape); err != nil {
			return nil, err
		}
	}
	if err := ggufRopeScaling(path, arch, num, str, &shape); err != nil {
		return nil, err
	}
	ctx, _ := num("context_length", 0, false)
	if w, _ := num("attention.sliding_window", 0, false); w > 0 && w < ctx && !archInfo.gemma {
		// Phi-3 mini 4k's window, on every layer: the model was trained
		// with it, Hugging Face and vLLM apply it (llama.cpp drops it).
		if w != float64(int32(w)) {
			return nil, fmt.Errorf("model %s: GGUF metadata %s.attention.sliding_window = %v is not an integer", path, arch, w)
		}
		if shape.RopeLinearFactor != 0 {
			return nil, fmt.Errorf("model %s: linear RoPE scaling of a %s model with sliding-window layers is not supported", path, arch)
		}
		shape.SlidingWindow = int(w)
	}
	return loadGGUFTensors(path, gf, arch, num, str, shape, int(ctx))
}

// ggufHeadDim reads a GQA model's head size (and, where partial says the
// architecture turns part of each head, a rope.dimension_count below
// attention.key_length as its partial rotation).
func ggufHeadDim(path, arch string, num func(string, float64, bool) (float64, error), kvs gguf.GGUFMetadataKVs, shape *bridge.ModelShape, partial bool) error {
	// The head size: attention.key_length (Qwen3 writes it, and its heads
	// need not tile the hidden size), else the RoPE dimension, else
	// hidden / heads. RoPE must rotate the whole head, and V heads must be
	// as wide as K heads.
	headDim, err := num("rope.dimension_count", float64(shape.HiddenSize/shape.NumHeads), false)
	if err != nil {
		return err
	}
	if kl, err := num("attention.key_length", headDim, false); err != nil {
		return err
	} else if _, hasRope := kvs.Get(arch + ".rope.dimension_count"); !hasRope {
		headDim = kl
	} else if kl != headDim && partial && headDim < kl && int(headDim)%2 == 0 {
		shape.PartialRotaryDim, headDim = int(headDim), kl
	} else if kl != headDim {
		return fmt.Errorf("model %s: attention.key_length %v differs from the RoPE dimension %v (partial RoPE is not supported for %s)", path, kl, headDim, arch)
	}
	if vl, err := num("attention.value_length", headDim, false); err != nil || vl != headDim {
		return fmt.Errorf("model %s: attention.value_length %v differs from the key length %v (unequal K and V heads are not supported)", path, vl, headDim)
	}
	if headDim != float64(int32(headDim)) || headDim <= 0 {
		return fmt.Errorf("model %s: the head size %v is not a positive integer", path, headDim)
	}
	shape.HeadDim = int(headDim)
	return nil
}

// loadGGUFTensors reads the tokenizer and maps the tensors of a GGUF file
// whose shape is read.
func loadGGUFTensors(path string, gf *gguf.GGUFFile, arch string, num func(string, float64, bool) (float64, error),
	str func(string) string, shape bridge.ModelShape, ctx int) (m *Model, err error) {
	kvs := gf.Header.MetadataKV
	archInfo := ggufArchitectures[arch]
	spec, err := ggufTokenizerSpec(path, kvs)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	tok, err := NewTokenizer(spec)
	if err != nil {
		return nil, fmt.Errorf("model %s: tokenizer: %w", path, err)
	}
	shape.VocabSize = tok.VocabSize()
	if v, err := num("vocab_size", float64(shape.VocabSize), false); err != nil || int(v) != shape.VocabSize {
		return nil, fmt.Errorf("model %s: %s.vocab_size %v differs from the tokenizer's %d tokens", path, arch, v, shape.VocabSize)
	}

	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	defer f.Close()
	mm, err := mmap.Map(f, mmap.RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("model %s: mapping the file: %w", path, err)
	}
	m = &Model{Path: path, Format: "gguf", Name: str("general.name"), ContextLength: ctx, Tokenizer: tok,
		mappings: []interface{ Close() error }{closerFunc(mm.Unmap)}}
	// Unmap on failure. The model is passed in: by the time this runs, an
	// error return has already set m to nil.
	defer func(partial *Model) {
		if err != nil {
			partial.Close()
			m = nil
		}
	}(m)
	if m.Name == "" {
		m.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}

	base := gf.TensorDataStartOffset
	align := uint64(32) // GGUF's default
	if v, ok := kvs.Get("general.alignment"); ok && v.ValueType.IsNumeric() {
		align = uint64(gguf.ValueNumeric[uint64](v))
	}
	if align == 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("model %s: general.alignment %d is not a power of two (corrupt file?)", path, align)
	}
	hasOutput := false
	longRoPE := ""
	for _, ti := range gf.TensorInfos {
		if sm := blkAnyTensor.FindStringSubmatch(ti.Name); archInfo.glm && sm != nil && sm[2] == "attn_q_norm.weight" && atoi(sm[1]) < shape.NumLayers {
			shape.QKNorm = true // (GLM-4.5 355B has q/k norms, -Air none)
		}
	}
	for _, ti := range gf.TensorInfos {
		if _, ok := ggufLongRoPE[ti.Name]; ok {
			orig, err := num("rope.scaling.original_context_length", 0, false)
			if err != nil {
				return nil, err
			}
			if orig <= 0 || orig != float64(int32(orig)) {
				return nil, fmt.Errorf("model %s: tensor %s (LongRoPE) needs a positive %s.rope.scaling.original_context_length, got %v", path, ti.Name, arch, orig)
			}
			longRoPE = map[bool]string{true: "long", false: "short"}[float64(ctx) > orig]
			break
		}
	}
	for _, ti := range gf.TensorInfos {
		kind, layer, expert, stacked := bridge.WeightKind(-1), -1, 0, false
		if sm := blkAnyTensor.FindStringSubmatch(ti.Name); archInfo.glm && sm != nil && atoi(sm[1]) >= shape.NumLayers {
			continue // a multi-token-prediction layer (model/glm.go)
		}
		if k, ok := ggufGlobalTensor[ti.Name]; ok {
			kind = k
			hasOutput = hasOutput || k == bridge.WeightLMHead
		} else if sm := blkRouterBias.FindStringSubmatch(ti.Name); sm != nil {
			l, _ := strconv.Atoi(sm[1])
			if l >= shape.NumLayers {
				return nil, fmt.Errorf("model %s: tensor %s: layer out of range (%d layers)", path, ti.Name, shape.NumLayers)
			}
			kind, layer = bridge.WeightRouterBias, l
		} else if sm := blkProjBias.FindStringSubmatch(ti.Name); sm != nil {
			l, _ := strconv.Atoi(sm[1])
			if l >= shape.NumLayers {
				return nil, fmt.Errorf("model %s: tensor %s: layer out of range (%d layers)", path, ti.Name, shape.NumLayers)
			}
			kind, layer = projBiasKind[sm[2]], l
		} else if sm := blkTensor.FindStringSubmatch(ti.Name); sm != nil {
			k, ok := ggufLayerTensor[sm[2]]
			if !ok {
				k, stacked = ggufStackedExperts[sm[2]]
			}
			l, _ := strconv.Atoi(sm[1])
			if !ok && !stacked || l >= shape.NumLayers {
				return nil, fmt.Errorf("model %s: tensor %s is not part of a %s decoder this loader reads (unsupported architecture variant)", path, ti.Name, arch)
			}
			kind, layer = k, l
		} else if sm := blkExpertTensor.FindStringSubmatch(ti.Name); sm != nil {
			l, _ := strconv.Atoi(sm[1])
			e, _ := strconv.Atoi(sm[3])
			if l >= shape.NumLayers || e >= shape.NumExperts {
				return nil, fmt.Errorf("model %s: tensor %s: layer or expert out of range (%d layers, %d experts)", path, ti.Name, shape.NumLayers, shape.NumExperts)
			}
			kind = map[string]bridge.WeightKind{"gate": bridge.WeightExpertGate, "up": bridge.WeightExpertUp, "down": bridge.WeightExpertDown}[sm[2]]
			layer, expert = l, e
		} else if set, ok := ggufLongRoPE[ti.Name]; ok {
			// LongRoPE (Phi-3.5, Phi-4-mini): the divisors of the long
			// contexts when the model's context is longer than the one it
			// was trained at first, else the short ones (llama.cpp's choice
			// by the context it serves; this loader serves the whole one).
			if set != longRoPE {
				continue
			}
			kind = bridge.WeightRopeFreqs
		} else if ti.Name == "rope_freqs.weight" {
			// Llama 3.1/3.2 GGUF: the Llama-3 scaling as per-dimension divisors.
			kind = bridge.WeightRopeFreqs
		} else {
			return nil, fmt.Errorf("model %s: tensor %s is not part of a %s decoder this loader reads (unsupported architecture variant)", path, ti.Name, arch)
		}
		dt, ok := ggufTypes[ti.Type]
		if !ok {
			return nil, fmt.Errorf("model %s: tensor %s has type %v; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K", path, ti.Name, ti.Type)
		}
		perHead := kind == bridge.WeightKB || kind == bridge.WeightVB // 3-D, read flat
		if n := len(ti.Dimensions); stacked != (n == 3) && !perHead {
			want := "1 or 2"
			if stacked {
				want = "3 (experts, rows, cols)"
			}
			return nil, fmt.Errorf("model %s: tensor %s has %d dimensions, want %s", path, ti.Name, n, want)
		}
		rows, cols, start, end, err := tensorSpan(ti, dt, base, align, int64(len(mm)))
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", path, err)
		}
		if archInfo.glm && kind == bridge.WeightAttnPostNorm {
			kind = bridge.WeightMLPNorm // GLM's post_attention_norm is the MLP's input norm
		}
		t := bridge.WeightTensor{Name: ti.Name, Kind: kind, Layer: layer, Expert: expert, DType: dt, Rows: rows, Cols: cols, Data: mm[start:end:end]}
		if arch == "phi3" && kind == bridge.WeightUp && rows == 2*int64(shape.IntermediateSize) {
			t.Kind = weightGateUp // phi3's ffn_up holds the gate, then the up projection
		}
		if t.Kind == weightQKV || t.Kind == weightGateUp {
			parts, err := splitFused(shape, t)
			if err != nil {
				return nil, fmt.Errorf("model %s: %w", path, err)
			}
			m.Tensors = append(m.Tensors, parts...)
			continue
		}
		// llama.cpp's converter interleaves each head's Q and K rows for its
		// adjacent-pair RoPE (Llama only); the engines rotate halves.
		switch {
		case kind == bridge.WeightQ && archInfo.interleaved:
			t.InterleavedRopeHeads = shape.NumHeads
		case kind == bridge.WeightK && archInfo.interleaved:
			t.InterleavedRopeHeads = shape.NumKVHeads
		case kind == bridge.WeightKVA && archInfo.interleaved:
			t.InterleavedRopeHeads = 1 // the latent's rope tail (k_pe)
		}
		if !stacked {
			m.Tensors = append(m.Tensors, t)
			continue
		}
		// One tensor per expert: consecutive planes of rows/E rows each.
		E := int64(ti.Dimensions[2])
		if int(E) != shape.NumExperts {
			return nil, fmt.Errorf("model %s: tensor %s stacks %d experts, %s.expert_count is %d", path, ti.Name, E, arch, shape.NumExperts)
		}
		per, planeBytes := rows/E, int64(len(t.Data))/E
		for e := int64(0); e < E; e++ {
			x := t
			x.Name = fmt.Sprintf("%s[expert %d]", ti.Name, e)
			x.Expert, x.Rows = int(e), per
			x.Data = t.Data[e*planeBytes : (e+1)*planeBytes : (e+1)*planeBytes]
			m.Tensors = append(m.Tensors, x)
		}
	}
	shape.TiedEmbeddings = !hasOutput
	if err := shape.Validate(); err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	m.Shape = shape
	if err := checkTensors(shape, m.Tensors); err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	return m, nil
}

// tensorSpan is where a tensor's data lies in the mapped file of size
// bytes (data section at base): every dimension and product is checked
// before it is formed, so that a corrupt header cannot wrap around into a
// slice of the mapping.
func tensorSpan(ti gguf.GGUFTensorInfo, dt bridge.DType, base int64, align uint64, size int64) (rows, cols, start, end int64, err error) {
	if n := len(ti.Dimensions); n < 1 || n > 3 {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s has %d dimensions, want 1 to 3", ti.Name, n)
	}
	for _, d := range ti.Dimensions {
		if d < 1 || d > maxTensorDim {
			return 0, 0, 0, 0, fmt.Errorf("tensor %s has dimensions %v; each must be in [1, 2^40] (truncated or corrupt file?)", ti.Name, ti.Dimensions)
		}
	}
	rows, cols = 1, int64(ti.Dimensions[0])
	if len(ti.Dimensions) >= 2 {
		rows = int64(ti.Dimensions[1])
	}
	if len(ti.Dimensions) == 3 {
		// Stacked experts: the planes' rows, one after the other.
		if rows > maxTensorDim/int64(ti.Dimensions[2]) {
			return 0, 0, 0, 0, fmt.Errorf("tensor %s has dimensions %v: too many rows (corrupt file?)", ti.Name, ti.Dimensions)
		}
		rows *= int64(ti.Dimensions[2])
	}
	rb, err := dt.RowBytes(cols)
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s: %w", ti.Name, err)
	}
	if ti.Offset%align != 0 {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s's data offset %d is not a multiple of general.alignment %d (corrupt file?)", ti.Name, ti.Offset, align)
	}
	if ti.Offset > uint64(size) || rb > size || rows > size/max(rb, 1) {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s (%v at offset %d) lies outside the file (%d bytes); truncated or corrupt file?", ti.Name, ti.Dimensions, ti.Offset, size)
	}
	start = base + int64(ti.Offset)
	end = start + rb*rows
	if start < base || end > size {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s's data [%d, %d) lies outside the file (%d bytes); truncated or corrupt file (download incomplete?)", ti.Name, start, end, size)
	}
	return rows, cols, start, end, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// ggufMoE reads the mixture-of-experts metadata of arch into shape:
// expert_count 0 or absent is a dense model. The expert width is
// expert_feed_forward_length (Qwen3-MoE, DeepSeek), else
// feed_forward_length (llama with experts: Mixtral). Router weighting as
// llama.cpp computes each family: Qwen3-MoE softmax over every expert,
// top-k, renormalised; Mixtral top-k, then softmax over the k (the same
// weights); DeepSeek per expert_gating_func (1 softmax, 2 sigmoid),
// expert_weights_norm, expert_weights_scale and the expert groups, with
// leading_dense_block_count dense layers and shared experts.
func ggufMoE(path, arch string, num func(string, float64, bool) (float64, error), kvs gguf.GGUFMetadataKVs, shape *bridge.ModelShape) error {
	deepseek := arch == "deepseek2" || arch == "glm4moe" // (GLM-4.5's MoE is DeepSeek-V3's)
	experts, err := num("expert_count", 0, false)
	if err != nil {
		return err
	}
	if experts == 0 {
		if arch == "qwen3moe" {
			return fmt.Errorf("model %s: qwen3moe.expert_count is missing or 0", path)
		}
		return nil
	}
	used, err := num("expert_used_count", 0, true)
	if err != nil {
		return err
	}
	width, err := num("expert_feed_forward_length", float64(shape.IntermediateSize), arch == "qwen3moe" || deepseek)
	if err != nil {
		return err
	}
	shared, err := num("expert_shared_count", 0, false)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		key string
		v   float64
	}{{"expert_count", experts}, {"expert_used_count", used}, {"expert_feed_forward_length", width}} {
		if f.v != float64(int32(f.v)) || f.v <= 0 {
			return fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a positive integer", path, arch, f.key, f.v)
		}
	}
	if shared != 0 && !deepseek {
		return fmt.Errorf("model %s: %s.expert_shared_count = %v: shared experts of this architecture are not supported", path, arch, shared)
	}
	if shared < 0 || shared != float64(int32(shared)) {
		return fmt.Errorf("model %s: GGUF metadata %s.expert_shared_count = %v is not a non-negative integer", path, arch, shared)
	}
	shape.NumExperts, shape.NumExpertsPerTok, shape.MoEIntermediateSize = int(experts), int(used), int(width)
	shape.NumSharedExperts = int(shared)
	shape.RouterNorm = bridge.RouterSoftmaxTopK
	if arch == "llama" {
		shape.RouterNorm = bridge.RouterTopKSoftmax
	}
	if !deepseek {
		return nil
	}
	ints := []struct {
		key string
		dst *int
	}{{"leading_dense_block_count", &shape.FirstDenseLayers}, {"expert_group_count", &shape.ExpertGroups},
		{"expert_group_used_count", &shape.ExpertGroupsUsed}}
	for _, f := range ints {
		v, err := num(f.key, 0, false)
		if err != nil {
			return err
		}
		if v < 0 || v != float64(int32(v)) {
			return fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a non-negative integer", path, arch, f.key, v)
		}
		*f.dst = int(v)
	}
	if shape.ExpertGroups <= 1 {
		shape.ExpertGroups, shape.ExpertGroupsUsed = 0, 0 // one group: no limit
	}
	defGating := 1.0
	if arch == "glm4moe" {
		defGating = 2 // sigmoid, llama.cpp's default for it
	}
	gating, err := num("expert_gating_func", defGating, false)
	if err != nil {
		return err
	}
	norm := false
	if v, ok := kvs.Get(arch + ".expert_weights_norm"); ok {
		if v.ValueType != gguf.GGUFMetadataValueTypeBool {
			return fmt.Errorf("model %s: GGUF metadata %s.expert_weights_norm is a %v, want a bool", path, arch, v.ValueType)
		}
		norm = v.ValueBool()
	}
	switch {
	case gating == 1 && norm:
		shape.RouterNorm = bridge.RouterSoftmaxTopK
	case gating == 1:
		shape.RouterNorm = bridge.RouterSoftmaxTopKRaw
	case gating == 2 && norm:
		shape.RouterNorm = bridge.RouterSigmoidTopK
	case gating == 2:
		shape.RouterNorm = bridge.RouterSigmoidTopKRaw
	default:
		return fmt.Errorf("model %s: %s.expert_gating_func = %v is not supported (1 softmax, 2 sigmoid)", path, arch, gating)
	}
	scale, err := num("expert_weights_scale", 1, false)
	if err != nil {
		return err
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return fmt.Errorf("model %s: GGUF metadata %s.expert_weights_scale = %v is not a positive number", path, arch, scale)
	}
	shape.RoutedScalingFactor = float32(scale)
	return nil
}

// ggufMLA reads deepseek2's latent-attention metadata into shape. Files of
// llama.cpp's current converter (the absorbed form, attn_k_b/attn_v_b)
// give the per-head sizes as attention.key_length_mla / value_length_mla
// and the latent's as key_length / value_length; older ones (attn_kv_b)
// give the per-head sizes as key_length / value_length.
func ggufMLA(path, arch string, num func(string, float64, bool) (float64, error), kvs gguf.GGUFMetadataKVs, shape *bridge.ModelShape) error {
	get := func(key string, def float64, required bool) (int, error) {
		v, err := num(key, def, required)
		if err != nil {
			return 0, err
		}
		if v < 0 || v != float64(int32(v)) {
			return 0, fmt.Errorf("model %s: GGUF metadata %s.%s = %v is not a non-negative integer", path, arch, key, v)
		}
		return int(v), nil
	}
	var err error
	if shape.QLoraRank, err = get("attention.q_lora_rank", 0, false); err != nil {
		return err
	}
	if shape.KVLoraRank, err = get("attention.kv_lora_rank", 0, true); err != nil {
		return err
	}
	if shape.QKRopeHeadDim, err = get("rope.dimension_count", 0, true); err != nil {
		return err
	}
	keyKey, valKey := "attention.key_length", "attention.value_length"
	if _, ok := kvs.Get(arch + ".attention.key_length_mla"); ok {
		keyKey, valKey = "attention.key_length_mla", "attention.value_length_mla"
	}
	if shape.HeadDim, err = get(keyKey, 0, true); err != nil {
		return err
	}
	if shape.VHeadDim, err = get(valKey, 0, true); err != nil {
		return err
	}
	if shape.KVLoraRank == 0 || shape.HeadDim <= shape.QKRopeHeadDim {
		return fmt.Errorf("model %s: %s.attention.kv_lora_rank %d and %s %d (with rope.dimension_count %d) do not describe latent attention",
			path, arch, shape.KVLoraRank, keyKey, shape.HeadDim, shape.QKRopeHeadDim)
	}
	shape.QKNopeHeadDim = shape.HeadDim - shape.QKRopeHeadDim
	shape.NumKVHeads = shape.NumHeads // the latent is shared; the shape counts query heads
	return nil
}

// ggufRopeScaling reads rope.scaling.*: YaRN for deepseek2 (DeepSeek-V3's
// form: the attention scale's mscale from yarn_log_multiplier = 0.1 ×
// mscale_all_dim, cos and sin unscaled as llama.cpp computes them), linear
// (llama.cpp's default type: Gemma 3, older Llama fine-tunes), none
// otherwise (llama.cpp writes Llama-3 scaling as the rope_freqs.weight
// tensor, which is read).
func ggufRopeScaling(path, arch string, num func(string, float64, bool) (float64, error), str func(string) string, shape *bridge.ModelShape) error {
	t := str(arch + ".rope.scaling.type")
	if t == "none" {
		return nil
	}
	if t == "" || t == "linear" {
		// llama.cpp's default type: the factor (or the older
		// rope.scale_linear) divides every position.
		factor, err := num("rope.scaling.factor", 0, false)
		if err != nil {
			return err
		}
		if factor == 0 {
			if factor, err = num("rope.scale_linear", 0, false); err != nil {
				return err
			}
		}
		switch {
		case factor == 0 || factor == 1:
			return nil
		case !(factor > 1) || math.IsInf(factor, 0):
			return fmt.Errorf("model %s: linear RoPE scaling factor %v is not supported (want > 1)", path, factor)
		case shape.SlidingWindow > 0 && arch != "gemma3":
			// (the engine scales the global layers only, as llama.cpp does for Gemma 3)
			return fmt.Errorf("model %s: linear RoPE scaling of a %s model with sliding-window layers is not supported", path, arch)
		}
		shape.RopeLinearFactor = float32(factor)
		return nil
	}
	if t != "yarn" || arch != "deepseek2" {
		return fmt.Errorf("model %s: RoPE scaling type %q is not supported for %s (supported: yarn on deepseek2; llama.cpp writes Llama-3 scaling as the rope_freqs.weight tensor, which is supported)", path, t, arch)
	}
	factor, err := num("rope.scaling.factor", 0, true)
	if err != nil {
		return err
	}
	orig, err := num("rope.scaling.original_context_length", 0, true)
	if err != nil {
		return err
	}
	fast, err := num("rope.scaling.yarn_beta_fast", 32, false)
	if err != nil {
		return err
	}
	slow, err := num("rope.scaling.yarn_beta_slow", 1, false)
	if err != nil {
		return err
	}
	logMul, err := num("rope.scaling.yarn_log_multiplier", 0, false)
	if err != nil {
		return err
	}
	if orig != float64(int32(orig)) || orig <= 0 {
		return fmt.Errorf("model %s: GGUF metadata %s.rope.scaling.original_context_length = %v is not a positive integer", path, arch, orig)
	}
	all := float32(logMul / 0.1)
	shape.Yarn = &bridge.YarnScaling{Factor: float32(factor), OriginalMaxPositions: int(orig), BetaFast: float32(fast),
		BetaSlow: float32(slow), MScale: all, MScaleAllDim: all}
	return nil
}
