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
}

var ggufGlobalTensor = map[string]bridge.WeightKind{
	"token_embd.weight": bridge.WeightEmbedding, "output_norm.weight": bridge.WeightFinalNorm,
	"output.weight": bridge.WeightLMHead,
}

var ggufTypes = map[gguf.GGMLType]bridge.DType{
	gguf.GGMLTypeF32: bridge.DTypeF32, gguf.GGMLTypeF16: bridge.DTypeF16, gguf.GGMLTypeBF16: bridge.DTypeBF16,
	gguf.GGMLTypeQ8_0: bridge.DTypeQ8_0, gguf.GGMLTypeQ4_0: bridge.DTypeQ4_0, gguf.GGMLTypeQ4_1: bridge.DTypeQ4_1,
}

var blkTensor = regexp.MustCompile(`^blk\.(\d+)\.([a-z_]+)\.weight$`)

// ggufArchitectures are the general.architecture values read as Llama.
var ggufArchitectures = map[string]bool{"llama": true}

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
	if !ggufArchitectures[arch] {
		return nil, fmt.Errorf("model %s: architecture %q is not supported (supported: llama)", path, arch)
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
	headDim, err := num("rope.dimension_count", float64(shape.HiddenSize/shape.NumHeads), false)
	if err != nil {
		return nil, err
	}
	shape.HeadDim = int(headDim)
	if kl, err := num("attention.key_length", headDim, false); err != nil || int(kl) != shape.HeadDim {
		return nil, fmt.Errorf("model %s: attention.key_length %v differs from the RoPE dimension %d (partial RoPE is not supported)", path, kl, shape.HeadDim)
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
	if experts, _ := num("expert_count", 0, false); experts > 0 {
		return nil, fmt.Errorf("model %s: mixture-of-experts checkpoints (%s.expert_count = %v) are not supported", path, arch, experts)
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
		kind, layer := bridge.WeightKind(-1), -1
		if k, ok := ggufGlobalTensor[ti.Name]; ok {
			kind = k
			hasOutput = hasOutput || k == bridge.WeightLMHead
		} else if sm := blkTensor.FindStringSubmatch(ti.Name); sm != nil {
			k, ok := ggufLayerTensor[sm[2]]
			l, _ := strconv.Atoi(sm[1])
			if !ok || l >= shape.NumLayers {
				return nil, fmt.Errorf("model %s: tensor %s is not part of a Llama decoder (unsupported architecture variant)", path, ti.Name)
			}
			kind, layer = k, l
		} else if ti.Name == "rope_freqs.weight" {
			// Llama 3.1/3.2 GGUF: the Llama-3 scaling as per-dimension divisors.
			kind = bridge.WeightRopeFreqs
		} else {
			return nil, fmt.Errorf("model %s: tensor %s is not part of a Llama decoder (unsupported architecture variant)", path, ti.Name)
		}
		dt, ok := ggufTypes[ti.Type]
		if !ok {
			return nil, fmt.Errorf("model %s: tensor %s has type %v; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1", path, ti.Name, ti.Type)
		}
		rows, cols, start, end, err := tensorSpan(ti, dt, base, align, int64(len(mm)))
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", path, err)
		}
		t := bridge.WeightTensor{Name: ti.Name, Kind: kind, Layer: layer, DType: dt, Rows: rows, Cols: cols, Data: mm[start:end:end]}
		// llama.cpp's converter interleaves each head's Q and K rows for its
		// adjacent-pair RoPE; the engines rotate halves.
		switch kind {
		case bridge.WeightQ:
			t.InterleavedRopeHeads = shape.NumHeads
		case bridge.WeightK:
			t.InterleavedRopeHeads = shape.NumKVHeads
		}
		m.Tensors = append(m.Tensors, t)
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
	if n := len(ti.Dimensions); n != 1 && n != 2 {
		return 0, 0, 0, 0, fmt.Errorf("tensor %s has %d dimensions, want 1 or 2", ti.Name, n)
	}
	for _, d := range ti.Dimensions {
		if d < 1 || d > maxTensorDim {
			return 0, 0, 0, 0, fmt.Errorf("tensor %s has dimensions %v; each must be in [1, 2^40] (truncated or corrupt file?)", ti.Name, ti.Dimensions)
		}
	}
	rows, cols = 1, int64(ti.Dimensions[0])
	if len(ti.Dimensions) == 2 {
		rows = int64(ti.Dimensions[1])
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
