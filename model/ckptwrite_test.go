package model

// Writers of tiny synthetic checkpoints for the cross-format tests: the same
// random Llama model as a Hugging Face directory (config.json, sharded
// safetensors in F32/BF16/F16, tokenizer.json, tokenizer_config.json) and as
// a hand-written GGUF v3 file (F32 or Q8_0 projections).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// tinyTensor is one weight in Hugging Face order: row-major [rows][cols]
// (a Linear's [out][in]; a norm is one row).
type tinyTensor struct {
	hf, gguf   string
	kind       bridge.WeightKind
	layer      int
	rows, cols int
	data       []float32
	q8         []byte // Q8_0 encoding of data ([rows][cols/32 blocks]) when quantised
	// experts > 0: a stacked expert tensor, rows/experts rows per expert,
	// written as GGUF's 3-D [experts][rows/experts][cols].
	experts int
}

// tinyModel is a synthetic checkpoint: shape, tokenizer and weights.
type tinyModel struct {
	name    string
	shape   bridge.ModelShape
	ctx     int
	tokens  []string
	types   []int32
	merges  []string
	bos     int32
	eos     int32
	addBOS  bool
	tmpl    string
	tensors []*tinyTensor
	// strayLMHead, with tied embeddings, is an lm_head.weight the HF
	// directory carries anyway (it must be ignored); nil = absent.
	strayLMHead []float32
}

const tinyChatTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

var tinyMerges = []string{"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
	"Ġ t", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ m", "Ġm o", "Ġmo d", "e l", "Ġmod el"}

// newTinyModel draws a 2-layer model (hidden 64, 4 heads, 2 KV heads,
// head_dim 16, FFN 96) whose weights are exact in F32, BF16 and F16: matrix
// entries are k·2^-10 or k·2^-8 with |k| <= 255, norm weights 1 + k/128.
func newTinyModel(seed int64, tied bool) *tinyModel {
	rng := rand.New(rand.NewSource(seed))
	m := &tinyModel{name: "tiny-llama", ctx: 128, addBOS: true, tmpl: tinyChatTemplate}
	for b := 0; b < 256; b++ {
		m.tokens = append(m.tokens, string(byteToRune[b]))
		m.types = append(m.types, TokenNormal)
	}
	have := map[string]bool{}
	for _, mg := range tinyMerges {
		l, r, _ := cutSpace(mg)
		if !have[l+r] {
			have[l+r] = true
			m.tokens = append(m.tokens, l+r)
			m.types = append(m.types, TokenNormal)
		}
	}
	m.merges = tinyMerges
	for _, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		m.tokens = append(m.tokens, s)
		m.types = append(m.types, TokenControl)
	}
	m.bos, m.eos = int32(len(m.tokens)-3), int32(len(m.tokens)-1)

	m.shape = bridge.ModelShape{NumLayers: 2, HiddenSize: 64, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		IntermediateSize: 96, VocabSize: len(m.tokens), RopeTheta: 100000, RMSEps: 1e-5, TiedEmbeddings: tied}
	s := m.shape
	mat := func(rows, cols int, scale float32) []float32 {
		d := make([]float32, rows*cols)
		for i := range d {
			d[i] = float32(rng.Intn(511)-255) * scale
		}
		return d
	}
	norm := func() []float32 {
		d := make([]float32, s.HiddenSize)
		for i := range d {
			d[i] = 1 + float32(rng.Intn(65)-32)/128
		}
		return d
	}
	add := func(hf, gg string, kind bridge.WeightKind, layer, rows, cols int, data []float32) {
		m.tensors = append(m.tensors, &tinyTensor{hf: hf, gguf: gg, kind: kind, layer: layer, rows: rows, cols: cols, data: data})
	}
	H, V, F, qd, kvd := s.HiddenSize, s.VocabSize, s.IntermediateSize, s.NumHeads*s.HeadDim, s.NumKVHeads*s.HeadDim
	add("model.embed_tokens.weight", "token_embd.weight", bridge.WeightEmbedding, -1, V, H, mat(V, H, 1.0/256))
	for l := 0; l < s.NumLayers; l++ {
		hp, gp := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blk.%d.", l)
		add(hp+"input_layernorm.weight", gp+"attn_norm.weight", bridge.WeightAttnNorm, l, 1, H, norm())
		add(hp+"self_attn.q_proj.weight", gp+"attn_q.weight", bridge.WeightQ, l, qd, H, mat(qd, H, 1.0/1024))
		add(hp+"self_attn.k_proj.weight", gp+"attn_k.weight", bridge.WeightK, l, kvd, H, mat(kvd, H, 1.0/1024))
		add(hp+"self_attn.v_proj.weight", gp+"attn_v.weight", bridge.WeightV, l, kvd, H, mat(kvd, H, 1.0/1024))
		add(hp+"self_attn.o_proj.weight", gp+"attn_output.weight", bridge.WeightO, l, H, qd, mat(H, qd, 1.0/1024))
		add(hp+"post_attention_layernorm.weight", gp+"ffn_norm.weight", bridge.WeightMLPNorm, l, 1, H, norm())
		add(hp+"mlp.gate_proj.weight", gp+"ffn_gate.weight", bridge.WeightGate, l, F, H, mat(F, H, 1.0/1024))
		add(hp+"mlp.up_proj.weight", gp+"ffn_up.weight", bridge.WeightUp, l, F, H, mat(F, H, 1.0/1024))
		add(hp+"mlp.down_proj.weight", gp+"ffn_down.weight", bridge.WeightDown, l, H, F, mat(H, F, 1.0/1024))
	}
	add("model.norm.weight", "output_norm.weight", bridge.WeightFinalNorm, -1, 1, H, norm())
	if !tied {
		add("lm_head.weight", "output.weight", bridge.WeightLMHead, -1, V, H, mat(V, H, 1.0/256))
	}
	return m
}

func cutSpace(s string) (string, string, bool) {
	i := bytes.IndexByte([]byte(s), ' ')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

func isProjection(k bridge.WeightKind) bool {
	return k == bridge.WeightQ || k == bridge.WeightK || k == bridge.WeightV || k == bridge.WeightO ||
		k == bridge.WeightGate || k == bridge.WeightUp || k == bridge.WeightDown
}

// quantiseProjections encodes every layer projection as Q8_0 (per 32-block
// d = max|x|/127 stored as f16, q = round(x/d)) and replaces its values by
// the dequantised float32(half(d))·q, so that an F32 checkpoint of the new
// values and a Q8_0 GGUF of the blocks hold the same numbers.
func (m *tinyModel) quantiseProjections() {
	for _, t := range m.tensors {
		if isProjection(t.kind) {
			t.q8 = quantiseQ8(t.data)
		}
	}
}

// quantiseQ8 encodes vals (rows of a multiple of 32 elements) as Q8_0
// blocks and replaces each value by its dequantised float32(half(d))·q.
func quantiseQ8(vals []float32) []byte {
	out := make([]byte, 0, len(vals)/32*34)
	for b := 0; b < len(vals)/32; b++ {
		blk := vals[32*b : 32*b+32]
		var amax float32
		for _, x := range blk {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		d := amax / 127
		dh := f32ToF16(d)
		out = binary.LittleEndian.AppendUint16(out, dh)
		df := f16ToF32(dh)
		for j, x := range blk {
			var q int8
			if d != 0 {
				q = int8(max(-127, min(127, math.Round(float64(x/d)))))
			}
			out = append(out, byte(q))
			blk[j] = df * float32(q)
		}
	}
	return out
}

// f16ToF32 decodes IEEE half bits exactly.
func f16ToF32(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	e, f := int(h>>10)&0x1f, float64(h&0x3ff)
	switch e {
	case 0:
		return sign * float32(math.Ldexp(f, -24))
	case 31:
		if f != 0 {
			return float32(math.NaN())
		}
		return sign * float32(math.Inf(1))
	}
	return sign * float32(math.Ldexp(1024+f, e-25))
}

// f32ToF16 rounds to the nearest half (ties to even) by binary search over
// the finite non-negative half values, which increase with their bits.
func f32ToF16(x float32) uint16 {
	var sign uint16
	if math.Signbit(float64(x)) {
		sign, x = 0x8000, -x
	}
	lo, hi := uint16(0), uint16(0x7bff) // largest finite
	if x >= f16ToF32(hi) {
		return sign | hi
	}
	for hi-lo > 1 { // invariant: f16(lo) <= x < f16(hi)
		mid := lo + (hi-lo)/2
		if f16ToF32(mid) <= x {
			lo = mid
		} else {
			hi = mid
		}
	}
	dl, dh := float64(x)-float64(f16ToF32(lo)), float64(f16ToF32(hi))-float64(x)
	if dl < dh || dl == dh && lo%2 == 0 {
		return sign | lo
	}
	return sign | hi
}

// encode spells float32 values in a safetensors dtype; BF16 and F16 must be
// exact (the test weights are chosen so).
func encode(t testing.TB, dtype string, vals []float32) []byte {
	t.Helper()
	var out []byte
	for _, v := range vals {
		switch dtype {
		case "F32":
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		case "BF16":
			b := math.Float32bits(v)
			if b&0xffff != 0 {
				t.Fatalf("%v is not exact in bf16", v)
			}
			out = binary.LittleEndian.AppendUint16(out, uint16(b>>16))
		case "F16":
			h := f32ToF16(v)
			if f16ToF32(h) != v {
				t.Fatalf("%v is not exact in f16", v)
			}
			out = binary.LittleEndian.AppendUint16(out, h)
		default:
			t.Fatalf("dtype %s", dtype)
		}
	}
	return out
}

// stTensor is one safetensors entry.
type stTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// writeSafetensors writes the format by hand: u64 header length, the JSON
// header (padded with spaces to 8 bytes), the data in the order given.
func writeSafetensors(t testing.TB, path string, ts []stTensor) {
	t.Helper()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	for _, x := range ts {
		header[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{off, off + len(x.data)}}
		off += len(x.data)
	}
	hj, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(hj)))
	buf = append(buf, hj...)
	for _, x := range ts {
		buf = append(buf, x.data...)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hfOptions varies the Hugging Face directory.
type hfOptions struct {
	dtype  string // "F32" (default), "BF16" or "F16"
	shards int    // 1: model.safetensors; 2 (default): two shards and model.safetensors.index.json
	// config edits config.json before it is written.
	config func(cfg map[string]any)
	// edit changes a shard's tensors before it is written.
	edit func(shard int, ts []stTensor) []stTensor
}

// writeHF writes m as a Hugging Face directory and returns it.
func writeHF(t testing.TB, m *tinyModel, o hfOptions) string {
	t.Helper()
	if o.dtype == "" {
		o.dtype = "F32"
	}
	if o.shards == 0 {
		o.shards = 2
	}
	dir := t.TempDir()
	s := m.shape
	cfg := map[string]any{
		"_name_or_path": m.name, "architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": s.HiddenSize, "intermediate_size": s.IntermediateSize, "num_hidden_layers": s.NumLayers,
		"num_attention_heads": s.NumHeads, "num_key_value_heads": s.NumKVHeads, "head_dim": s.HeadDim,
		"vocab_size": s.VocabSize, "rope_theta": float64(s.RopeTheta), "rms_norm_eps": 1e-5,
		"tie_word_embeddings": s.TiedEmbeddings, "max_position_embeddings": m.ctx, "hidden_act": "silu",
		"attention_bias": false, "mlp_bias": false, "rope_scaling": nil,
		"bos_token_id": m.bos, "eos_token_id": m.eos, "torch_dtype": map[string]string{"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[o.dtype],
	}
	if r := s.RopeScaling; r != nil {
		cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": r.Factor, "low_freq_factor": r.LowFreqFactor,
			"high_freq_factor": r.HighFreqFactor, "original_max_position_embeddings": r.OriginalMaxPositions}
	}
	if o.config != nil {
		o.config(cfg)
	}
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)

	// Shard 1: the embedding and the first half of the layers; shard 2 the rest.
	shards := make([][]stTensor, o.shards)
	for _, x := range m.tensors {
		i := 0
		if o.shards == 2 && (x.layer >= s.NumLayers/2 || x.layer < 0 && x.kind != bridge.WeightEmbedding) {
			i = 1
		}
		shape := []int{x.rows, x.cols}
		if x.rows == 1 {
			shape = []int{x.cols}
		}
		shards[i] = append(shards[i], stTensor{x.hf, o.dtype, shape, encode(t, o.dtype, x.data)})
	}
	if m.strayLMHead != nil {
		shards[o.shards-1] = append(shards[o.shards-1], stTensor{"lm_head.weight", o.dtype, []int{s.VocabSize, s.HiddenSize}, encode(t, o.dtype, m.strayLMHead)})
	}
	weightMap := map[string]string{}
	total := 0
	for i, ts := range shards {
		if o.edit != nil {
			ts = o.edit(i, ts)
		}
		file := "model.safetensors"
		if o.shards > 1 {
			file = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, o.shards)
		}
		for _, x := range ts {
			weightMap[x.name] = file
			total += len(x.data)
		}
		writeSafetensors(t, filepath.Join(dir, file), ts)
	}
	if o.shards > 1 {
		writeJSON(t, filepath.Join(dir, "model.safetensors.index.json"),
			map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap})
	}
	writeHFTokenizer(t, dir, m)
	return dir
}

// writeHFTokenizer writes tokenizer.json (byte-level BPE with SmolLM's
// Digits + ByteLevel pre-tokenizer) and tokenizer_config.json.
func writeHFTokenizer(t testing.TB, dir string, m *tinyModel) {
	t.Helper()
	vocab := map[string]int{}
	var added []map[string]any
	for i, tok := range m.tokens {
		vocab[tok] = i
		if m.types[i] == TokenControl {
			added = append(added, map[string]any{"id": i, "content": tok, "single_word": false, "lstrip": false,
				"rstrip": false, "normalized": false, "special": true})
		}
	}
	merges := make([][]string, len(m.merges))
	for i, mg := range m.merges {
		l, r, _ := cutSpace(mg)
		merges[i] = []string{l, r}
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added, "normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Digits", "individual_digits": true},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}}},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merges},
	}
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), map[string]any{
		"add_bos_token": m.addBOS, "add_prefix_space": false, "bos_token": m.tokens[m.bos], "eos_token": m.tokens[m.eos],
		"unk_token": nil, "chat_template": m.tmpl, "clean_up_tokenization_spaces": false,
		"model_max_length": m.ctx, "tokenizer_class": "GPT2Tokenizer"})
}

// GGUF metadata value types and ggml tensor types used here.
const (
	gvU32    = 4
	gvI32    = 5
	gvF32    = 6
	gvBool   = 7
	gvString = 8
	gvArray  = 9

	ggmlF32  = 0
	ggmlQ8_0 = 8
	ggmlQ4_K = 12
)

// ggufKV is one metadata pair; val is a string, uint32, int32, float32,
// bool, []string or []int32.
type ggufKV struct {
	key string
	val any
}

// ggufOptions varies the GGUF file.
type ggufOptions struct {
	arch string // general.architecture; "" = llama
	// typeOverride gives tensors an arbitrary ggml type whose data is
	// zeros of rowBytes per row.
	typeOverride map[string]struct {
		typ      uint32
		rowBytes int
	}
	// kvs edits the metadata before it is written.
	kvs func([]ggufKV) []ggufKV
	// ropeFreqs, when set, is written as rope_freqs.weight (F32).
	ropeFreqs []float32
	// header edits the tensor infos as written (dims and offset into the
	// data section) without moving the data.
	header func(i int, name string, dims []uint64, offset uint64) ([]uint64, uint64)
}

type ggufWriter struct{ bytes.Buffer }

func (w *ggufWriter) u32(v uint32) { w.Write(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *ggufWriter) u64(v uint64) { w.Write(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *ggufWriter) str(s string) { w.u64(uint64(len(s))); w.WriteString(s) }

func (w *ggufWriter) value(t testing.TB, v any) {
	switch x := v.(type) {
	case string:
		w.u32(gvString)
		w.str(x)
	case uint32:
		w.u32(gvU32)
		w.u32(x)
	case int32:
		w.u32(gvI32)
		w.u32(uint32(x))
	case float32:
		w.u32(gvF32)
		w.u32(math.Float32bits(x))
	case bool:
		w.u32(gvBool)
		if x {
			w.WriteByte(1)
		} else {
			w.WriteByte(0)
		}
	case []string:
		w.u32(gvArray)
		w.u32(gvString)
		w.u64(uint64(len(x)))
		for _, s := range x {
			w.str(s)
		}
	case []bool:
		w.u32(gvArray)
		w.u32(gvBool)
		w.u64(uint64(len(x)))
		for _, f := range x {
			w.WriteByte(map[bool]byte{false: 0, true: 1}[f])
		}
	case []int32:
		w.u32(gvArray)
		w.u32(gvI32)
		w.u64(uint64(len(x)))
		for _, i := range x {
			w.u32(uint32(i))
		}
	default:
		t.Fatalf("gguf value %T", v)
	}
}

// ggufRowOrder is llama.cpp's Q/K permutation: GGUF row 2i+s of a head holds
// HF row s·head_dim/2+i.
func ggufRowOrder(rows, headDim int) []int {
	order := make([]int, rows)
	half := headDim / 2
	for g := range order {
		h, j := g/headDim, g%headDim
		order[g] = h*headDim + (j%2)*half + j/2
	}
	return order
}

// writeGGUF writes m as a GGUF v3 file (projections in Q8_0 when m was
// quantised) and returns its path.
func writeGGUF(t testing.TB, m *tinyModel, o ggufOptions) string {
	t.Helper()
	s := m.shape
	arch := o.arch
	if arch == "" {
		arch = "llama"
	}
	fileType := uint32(0)
	for _, x := range m.tensors {
		if x.q8 != nil {
			fileType = 7 // MOSTLY_Q8_0
		}
	}
	kvs := []ggufKV{
		{"general.architecture", arch}, {"general.name", m.name}, {"general.alignment", uint32(32)},
		{"general.file_type", fileType},
		{arch + ".block_count", uint32(s.NumLayers)}, {arch + ".context_length", uint32(m.ctx)},
		{arch + ".embedding_length", uint32(s.HiddenSize)}, {arch + ".feed_forward_length", uint32(s.IntermediateSize)},
		{arch + ".attention.head_count", uint32(s.NumHeads)}, {arch + ".attention.head_count_kv", uint32(s.NumKVHeads)},
		{arch + ".rope.freq_base", s.RopeTheta}, {arch + ".attention.layer_norm_rms_epsilon", s.RMSEps},
		{arch + ".rope.dimension_count", uint32(s.HeadDim)}, {arch + ".vocab_size", uint32(s.VocabSize)},
		{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "smollm"},
		{"tokenizer.ggml.tokens", m.tokens}, {"tokenizer.ggml.token_type", m.types},
		{"tokenizer.ggml.merges", m.merges}, {"tokenizer.ggml.bos_token_id", uint32(m.bos)},
		{"tokenizer.ggml.eos_token_id", uint32(m.eos)}, {"tokenizer.ggml.add_bos_token", m.addBOS},
		{"tokenizer.chat_template", m.tmpl},
	}
	if o.kvs != nil {
		kvs = o.kvs(kvs)
	}

	type info struct {
		name  string
		dims  []uint64
		typ   uint32
		data  []byte
		start uint64
	}
	var infos []info
	var off uint64
	for _, x := range m.tensors {
		order := make([]int, x.rows)
		for r := range order {
			order[r] = r
		}
		// llama.cpp's converter permutes Q/K rows for "llama" only (Qwen
		// models use its NeoX rotation).
		switch x.kind {
		case bridge.WeightQ, bridge.WeightK:
			if arch == "llama" || arch == "granite" {
				order = ggufRowOrder(x.rows, s.HeadDim)
			}
		}
		in := info{name: x.gguf, dims: []uint64{uint64(x.cols), uint64(x.rows)}, typ: ggmlF32}
		if x.rows == 1 {
			in.dims = in.dims[:1]
		}
		if x.experts > 0 {
			in.dims = []uint64{uint64(x.cols), uint64(x.rows / x.experts), uint64(x.experts)}
		}
		if ov, ok := o.typeOverride[x.gguf]; ok {
			in.typ, in.data = ov.typ, make([]byte, ov.rowBytes*x.rows)
		} else if x.q8 != nil {
			in.typ = ggmlQ8_0
			rb := x.cols / 32 * 34
			for _, r := range order {
				in.data = append(in.data, x.q8[r*rb:(r+1)*rb]...)
			}
		} else {
			for _, r := range order {
				in.data = append(in.data, encode(t, "F32", x.data[r*x.cols:(r+1)*x.cols])...)
			}
		}
		in.start = off
		off += (uint64(len(in.data)) + 31) / 32 * 32
		infos = append(infos, in)
	}
	if o.ropeFreqs != nil {
		in := info{name: "rope_freqs.weight", dims: []uint64{uint64(len(o.ropeFreqs))}, typ: ggmlF32,
			data: encode(t, "F32", o.ropeFreqs), start: off}
		off += (uint64(len(in.data)) + 31) / 32 * 32
		infos = append(infos, in)
	}

	var w ggufWriter
	w.WriteString("GGUF")
	w.u32(3)
	w.u64(uint64(len(infos)))
	w.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		w.str(kv.key)
		w.value(t, kv.val)
	}
	for i, in := range infos {
		dims, start := in.dims, in.start
		if o.header != nil {
			dims, start = o.header(i, in.name, slices.Clone(dims), start)
		}
		w.str(in.name)
		w.u32(uint32(len(dims)))
		for _, d := range dims {
			w.u64(d)
		}
		w.u32(in.typ)
		w.u64(start)
	}
	for w.Len()%32 != 0 {
		w.WriteByte(0)
	}
	base := w.Len()
	for _, in := range infos {
		for uint64(w.Len()-base) < in.start {
			w.WriteByte(0)
		}
		w.Write(in.data)
	}
	path := filepath.Join(t.TempDir(), m.name+".gguf")
	if err := os.WriteFile(path, w.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHalfHelpers: f32ToF16 inverts f16ToF32 on every finite half and
// rounds halfway cases to even.
func TestHalfHelpers(t *testing.T) {
	for h := uint32(0); h < 0x10000; h++ {
		if h&0x7c00 == 0x7c00 {
			continue // inf, NaN
		}
		if got := f32ToF16(f16ToF32(uint16(h))); got != uint16(h) && !(h == 0x8000 && got == 0x8000) {
			t.Fatalf("half %#04x -> %v -> %#04x", h, f16ToF32(uint16(h)), got)
		}
	}
	for _, c := range []struct {
		x    float32
		want uint16
	}{{1, 0x3c00}, {1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}, {65504, 0x7bff}, {-2, 0xc000}, {0x1p-24, 0x0001}, {0x1p-26, 0}} {
		if got := f32ToF16(c.x); got != c.want {
			t.Errorf("f32ToF16(%v) = %#04x, want %#04x", c.x, got, c.want)
		}
	}
}
