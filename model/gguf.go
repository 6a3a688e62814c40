package model

import (
	"fmt"
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
}

// ggufStackedExperts are the 3-D expert tensors, [experts][rows][cols]
// (GGUF dimensions cols, rows, experts), sliced into one tensor per expert.
var ggufStackedExperts = map[string]bridge.WeightKind{
	"ffn_gate_exps": bridge.WeightExpertGate, "ffn_up_exps": bridge.WeightExpertUp, "ffn_down_exps": bridge.WeightExpertDown,
}

// blkExpertTensor is the per-expert 2-D form of older Mixtral GGUF files:
// blk.N.ffn_{gate,up,down}.E.weight.
var blkExpertTensor = regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$`)

var ggufGlobalTensor = map[string]bridge.WeightKind{
	"token_embd.weight": bridge.WeightEmbedding, "output_norm.weight": bridge.WeightFinalNorm,
	"output.weight": bridge.WeightLMHead,
}

var ggufTypes = map[gguf.GGMLType]bridge.DType{
	gguf.GGMLTypeF32: bridge.DTypeF32, gguf.GGMLTypeF16: bridge.DTypeF16, gguf.GGMLTypeBF16: bridge.DTypeBF16,
	gguf.GGMLTypeQ8_0: bridge.DTypeQ8_0, gguf.GGMLTypeQ4_0: bridge.DTypeQ4_0, gguf.GGMLTypeQ4_1: bridge.DTypeQ4_1,
}

var blkTensor = regexp.MustCompile(`^blk\.(\d+)\.([a-z_]+)\.weight$`)

// ggufArchitectures are the general.architecture values this loader reads:
// Llama (dense, or with experts: Mixtral), Qwen3 (q/k norms) and Qwen3-MoE.
// The value says whether llama.cpp's converter stored Q and K rows in its
// interleaved RoPE order (it permutes them for "llama" only; Qwen models
// use its NeoX rotation, which is rotate-half).
var ggufArchitectures = map[string]struct{ interleaved, qkNorm bool }{
	"llama":    {interleaved: true},
	"qwen3":    {qkNorm: true},
	"qwen3moe": {qkNorm: true},
}

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
		return nil, fmt.Errorf("model %s: architecture %q is not supported (supported: llama, qwen3, qwen3moe)", path, arch)
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
	kvHeads, err := num("attention.head_count_kv", float64(shape.NumHeads), false)
	if err != nil {
		return nil, err
	}
	shape.NumKVHeads = int(kvHeads)
	// The head size: attention.key_length (Qwen3 writes it, and its heads
	// need not tile the hidden size), else the RoPE dimension, else
	// hidden / heads. RoPE must rotate the whole head, and V heads must be
	// as wide as K heads.
	headDim, err := num("rope.dimension_count", float64(shape.HiddenSize/shape.NumHeads), false)
	if err != nil {
		return nil, err
	}
	if kl, err := num("attention.key_length", headDim, false); err != nil {
		return nil, err
	} else if _, hasRope := kvs.Get(arch + ".rope.dimension_count"); !hasRope {
		headDim = kl
	} else if kl != headDim {
		return nil, fmt.Errorf("model %s: attention.key_length %v differs from the RoPE dimension %v (partial RoPE is not supported)", path, kl, headDim)
	}
	if vl, err := num("attention.value_length", headDim, false); err != nil || vl != headDim {
		return nil, fmt.Errorf("model %s: attention.value_length %v differs from the key length %v (unequal K and V heads are not supported)", path, vl, headDim)
	}
	if headDim != float64(int32(headDim)) || headDim <= 0 {
		return nil, fmt.Errorf("model %s: the head size %v is not a positive integer", path, headDim)
	}
	shape.HeadDim = int(headDim)
	shape.QKNorm = archInfo.qkNorm
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
	if err := ggufMoE(path, arch, num, &shape); err != nil {
		return nil, err
	}
	if t := str(arch + ".rope.scaling.type"); t != "" && t != "none" {
		return nil, fmt.Errorf("model %s: RoPE scaling type %q is not supported (llama.cpp writes Llama-3 scaling as the rope_freqs.weight tensor, which is supported)", path, t)
	}
	ctx, _ := num("context_length", 0, false)

	spec, err := TokenizerSpecFromGGUF(kvs)
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
	m = &Model{Path: path, Format: "gguf", Name: str("general.name"), ContextLength: int(ctx), Tokenizer: tok,
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
	for _, ti := range gf.TensorInfos {
		kind, layer, expert, stacked := bridge.WeightKind(-1), -1, 0, false
		if k, ok := ggufGlobalTensor[ti.Name]; ok {
			kind = k
			hasOutput = hasOutput || k == bridge.WeightLMHead
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
		} else if ti.Name == "rope_freqs.weight" {
			// Llama 3.1/3.2 GGUF: the Llama-3 scaling as per-dimension divisors.
			kind = bridge.WeightRopeFreqs
		} else {
			return nil, fmt.Errorf("model %s: tensor %s is not part of a %s decoder this loader reads (unsupported architecture variant)", path, ti.Name, arch)
		}
		dt, ok := ggufTypes[ti.Type]
		if !ok {
			return nil, fmt.Errorf("model %s: tensor %s has type %v; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1", path, ti.Name, ti.Type)
		}
		if n := len(ti.Dimensions); stacked != (n == 3) {
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
		t := bridge.WeightTensor{Name: ti.Name, Kind: kind, Layer: layer, Expert: expert, DType: dt, Rows: rows, Cols: cols, Data: mm[start:end:end]}
		// llama.cpp's converter interleaves each head's Q and K rows for its
		// adjacent-pair RoPE (Llama only); the engines rotate halves.
		switch {
		case kind == bridge.WeightQ && archInfo.interleaved:
			t.InterleavedRopeHeads = shape.NumHeads
		case kind == bridge.WeightK && archInfo.interleaved:
			t.InterleavedRopeHeads = shape.NumKVHeads
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
// expert_feed_forward_length (Qwen3-MoE), else feed_forward_length (llama
// with experts: Mixtral). Router weighting as llama.cpp computes each
// family: Qwen3-MoE softmax over every expert, top-k, renormalised; Mixtral
// top-k, then softmax over the k (the same weights).
func ggufMoE(path, arch string, num func(string, float64, bool) (float64, error), shape *bridge.ModelShape) error {
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
	width, err := num("expert_feed_forward_length", float64(shape.IntermediateSize), arch == "qwen3moe")
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
	if shared != 0 {
		return fmt.Errorf("model %s: %s.expert_shared_count = %v: shared experts of this architecture are not supported", path, arch, shared)
	}
	shape.NumExperts, shape.NumExpertsPerTok, shape.MoEIntermediateSize = int(experts), int(used), int(width)
	shape.RouterNorm = bridge.RouterSoftmaxTopK
	if arch == "llama" {
		shape.RouterNorm = bridge.RouterTopKSoftmax
	}
	return nil
}
