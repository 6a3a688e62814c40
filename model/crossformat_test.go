package model

// Cross-format tests: the same tiny random Llama written as a GGUF file and
// as a Hugging Face directory (ckptwrite_test.go) must load into the same
// shape, the same tokenizer, the same float weights, and — run through the
// native CPU engine (with -tags native) — bit-identical logits and greedy
// tokens. Without the native engine the engine comparison is skipped; the
// weight comparison still runs.

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
)

func loadOK(t *testing.T, path string) *Model {
	t.Helper()
	m, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close(%s): %v", path, err)
		}
	})
	return m
}

type weightKey struct {
	kind   bridge.WeightKind
	layer  int
	expert int
}

// hfFloats decodes a loaded tensor to float32 in Hugging Face row order
// (undoing GGUF's Q/K interleave), as the engine does.
func hfFloats(t *testing.T, w bridge.WeightTensor, headDim int64) []float32 {
	t.Helper()
	rb, err := w.DType.RowBytes(w.Cols)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, w.Rows*w.Cols)
	for r := int64(0); r < w.Rows; r++ {
		row := w.Data[r*rb : (r+1)*rb]
		dst := r
		if w.InterleavedRopeHeads > 0 {
			h, j := r/headDim, r%headDim
			dst = h*headDim + (j%2)*(headDim/2) + j/2
		}
		o := out[dst*w.Cols : (dst+1)*w.Cols]
		for c := range o {
			switch w.DType {
			case bridge.DTypeF32:
				o[c] = math.Float32frombits(binary.LittleEndian.Uint32(row[4*c:]))
			case bridge.DTypeF16:
				o[c] = f16ToF32(binary.LittleEndian.Uint16(row[2*c:]))
			case bridge.DTypeBF16:
				o[c] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(row[2*c:])) << 16)
			case bridge.DTypeQ8_0:
				blk := row[c/32*34:]
				o[c] = f16ToF32(binary.LittleEndian.Uint16(blk)) * float32(int8(blk[2+c%32]))
			default:
				t.Fatalf("%s: dtype %s not decoded here", w.Name, w.DType)
			}
		}
	}
	return out
}

func weightsOf(t *testing.T, m *Model) map[weightKey][]float32 {
	t.Helper()
	ws := map[weightKey][]float32{}
	for _, w := range m.Tensors {
		k := weightKey{w.Kind, w.Layer, w.Expert}
		if _, dup := ws[k]; dup {
			t.Fatalf("%s: weight %v twice", m.Path, k)
		}
		ws[k] = hfFloats(t, w, int64(m.Shape.HeadDim))
	}
	return ws
}

var crossTexts = []string{
	"hello world",
	"Hello, World! The tiny model in 2024: 12345 tokens.",
	"<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
	"  the  model\n\n\tin ün 😀 <|endoftext|>",
}

// requireSameModel: same shape, context, name, tokenizer and float weights.
func requireSameModel(t *testing.T, a, b *Model) {
	t.Helper()
	if !reflect.DeepEqual(a.Shape, b.Shape) {
		t.Fatalf("shapes differ:\n%s: %+v\n%s: %+v", a.Path, a.Shape, b.Path, b.Shape)
	}
	if a.ContextLength != b.ContextLength || a.Name != b.Name {
		t.Errorf("context/name differ: %d %q vs %d %q", a.ContextLength, a.Name, b.ContextLength, b.Name)
	}
	if sa, sb := a.Tokenizer.Spec(), b.Tokenizer.Spec(); !reflect.DeepEqual(sa, sb) {
		t.Errorf("tokenizer specs differ:\n%+v\n%+v", sa, sb)
	}
	for _, text := range crossTexts {
		for _, o := range []EncodeOptions{{}, {AddSpecial: true, ParseSpecial: true}} {
			ea, eb := a.Tokenizer.Encode(text, o), b.Tokenizer.Encode(text, o)
			if !slices.Equal(ea, eb) {
				t.Errorf("Encode(%q, %+v): %v vs %v", text, o, ea, eb)
			}
		}
	}
	wa, wb := weightsOf(t, a), weightsOf(t, b)
	if len(wa) != len(wb) {
		t.Fatalf("%d weights vs %d", len(wa), len(wb))
	}
	for k, va := range wa {
		vb, ok := wb[k]
		if !ok {
			t.Fatalf("weight %v only in %s", k, a.Path)
		}
		for i := range va {
			if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
				t.Fatalf("weight %v [%d]: %v vs %v", k, i, va[i], vb[i])
			}
		}
	}
}

// engineRun is a prefill and five greedy decode steps.
type engineRun struct {
	sampled []int32
	logits  [][]float32
}

func crossPrompt(t *testing.T, m *Model) []int32 {
	p := m.Tokenizer.Encode("<|im_start|>user\nhello world, the model<|im_end|>\n<|im_start|>assistant\n",
		EncodeOptions{AddSpecial: true, ParseSpecial: true})
	t.Logf("prompt of %d tokens", len(p))
	if len(p) < 16 || len(p) > 24 {
		t.Fatalf("prompt of %d tokens", len(p))
	}
	return p
}

func runEngine(t *testing.T, m *Model, prompt []int32) engineRun {
	t.Helper()
	if !haveEngine() {
		t.Skip("built without the native engine (go test -tags native)")
	}
	const P, pages = 4, 8 // 32 positions: the prompt and five decoded tokens
	eng, err := native.Open(bridge.Config{Shape: m.Shape, Tensors: m.Tensors, NumPages: pages, TokensPerPage: P})
	if err != nil {
		t.Fatalf("%s: %v", m.Path, err)
	}
	defer eng.Close()
	table := make([]int32, pages)
	for i := range table {
		table[i] = int32(i)
	}
	var run engineRun
	var res bridge.StepResult
	seq := bridge.SeqStep{Tokens: prompt, BlockTable: table, Sample: true}
	for step := 0; step < 6; step++ {
		if err := eng.Step(&bridge.StepDesc{Seqs: []bridge.SeqStep{seq}, WantLogits: true}, &res); err != nil {
			t.Fatalf("%s: step %d: %v", m.Path, step, err)
		}
		if len(res.Logits) != m.Shape.VocabSize {
			t.Fatalf("%d logits, want %d", len(res.Logits), m.Shape.VocabSize)
		}
		tok := res.Sampled[0]
		if best := int32(argmax(res.Logits)); best != tok {
			t.Fatalf("step %d sampled %d, argmax %d", step, tok, best)
		}
		run.sampled = append(run.sampled, tok)
		run.logits = append(run.logits, slices.Clone(res.Logits))
		seq = bridge.SeqStep{Tokens: []int32{tok}, StartPos: seq.StartPos + len(seq.Tokens), BlockTable: table, Sample: true}
	}
	return run
}

func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

func requireSameRun(t *testing.T, a, b engineRun) {
	t.Helper()
	if !slices.Equal(a.sampled, b.sampled) {
		t.Fatalf("sampled %v vs %v", a.sampled, b.sampled)
	}
	for s := range a.logits {
		for i := range a.logits[s] {
			if math.Float32bits(a.logits[s][i]) != math.Float32bits(b.logits[s][i]) {
				t.Fatalf("step %d logit %d: %v vs %v", s, i, a.logits[s][i], b.logits[s][i])
			}
		}
	}
	if len(a.logits) == 0 {
		return // no engine
	}
	// The logits must carry information: finite and not all equal.
	lo, hi := a.logits[0][0], a.logits[0][0]
	for _, x := range a.logits[0] {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("logit %v", x)
		}
		lo, hi = min(lo, x), max(hi, x)
	}
	if !(hi-lo > 1e-3) {
		t.Fatalf("flat logits [%v, %v]", lo, hi)
	}
}

func haveEngine() bool { return len(native.SupportedBackends()) > 0 }

// crossCheck loads both checkpoints, requires the same model, then runs the
// engine on both and requires bit-identical results. Without the native
// engine it stops after the model comparison and returns an empty run.
func crossCheck(t *testing.T, pathA, pathB string) engineRun {
	t.Helper()
	a, b := loadOK(t, pathA), loadOK(t, pathB)
	requireSameModel(t, a, b)
	if !haveEngine() {
		t.Log("built without the native engine (go test -tags native): engine comparison skipped")
		return engineRun{}
	}
	prompt := crossPrompt(t, a)
	ra := runEngine(t, a, prompt)
	rb := runEngine(t, b, prompt)
	requireSameRun(t, ra, rb)
	return ra
}

func requireDTypes(t *testing.T, path string, want func(bridge.WeightKind) bridge.DType) {
	t.Helper()
	m := loadOK(t, path)
	for _, w := range m.Tensors {
		if w.DType != want(w.Kind) {
			t.Fatalf("%s: %s is %s, want %s", path, w.Name, w.DType, want(w.Kind))
		}
		if want := map[bridge.WeightKind]int{bridge.WeightQ: m.Shape.NumHeads, bridge.WeightK: m.Shape.NumKVHeads}[w.Kind]; m.Format == "gguf" && w.InterleavedRopeHeads != want {
			t.Fatalf("%s: %s interleaved heads %d, want %d", path, w.Name, w.InterleavedRopeHeads, want)
		}
	}
}

func allDType(d bridge.DType) func(bridge.WeightKind) bridge.DType {
	return func(bridge.WeightKind) bridge.DType { return d }
}

func TestCrossFormatGGUFvsHF(t *testing.T) {
	for _, tied := range []bool{false, true} {
		name := map[bool]string{false: "untied", true: "tied"}[tied]
		t.Run(name, func(t *testing.T) {
			m := newTinyModel(1, tied)
			gg := writeGGUF(t, m, ggufOptions{})
			hf := writeHF(t, m, hfOptions{})
			requireDTypes(t, gg, allDType(bridge.DTypeF32))
			ref := crossCheck(t, gg, hf)
			if tied {
				// An lm_head.weight next to tie_word_embeddings is ignored.
				stray := newTinyModel(99, false)
				m.strayLMHead = stray.tensors[len(stray.tensors)-1].data
				hf2 := writeHF(t, m, hfOptions{})
				requireSameRun(t, ref, crossCheck(t, gg, hf2))
			} else {
				// One model.safetensors instead of shards.
				hf1 := writeHF(t, m, hfOptions{shards: 1})
				requireSameRun(t, ref, crossCheck(t, gg, hf1))
			}
		})
	}
}

// withQKVBias adds Qwen2's q, k and v projection biases to a tiny model
// (entries k/64, |k| <= 64: exact in every dtype, large enough to move the
// logits).
func withQKVBias(m *tinyModel, seed int64) *tinyModel {
	rng := rand.New(rand.NewSource(seed))
	m.shape.QKVBias = true
	m.name = "tiny-qwen2"
	var out []*tinyTensor
	for _, x := range m.tensors {
		out = append(out, x)
		if x.kind < bridge.WeightQ || x.kind > bridge.WeightV {
			continue
		}
		b := make([]float32, x.rows)
		for i := range b {
			b[i] = float32(rng.Intn(129)-64) / 64
		}
		part := map[bridge.WeightKind]string{bridge.WeightQ: "q", bridge.WeightK: "k", bridge.WeightV: "v"}[x.kind]
		out = append(out, &tinyTensor{hf: fmt.Sprintf("model.layers.%d.self_attn.%s_proj.bias", x.layer, part),
			gguf: fmt.Sprintf("blk.%d.attn_%s.bias", x.layer, part), kind: x.kind + bridge.WeightQBias - bridge.WeightQ,
			layer: x.layer, rows: 1, cols: x.rows, data: b})
	}
	m.tensors = out
	return m
}

// TestCrossFormatQwen2: a Qwen2 model (q/k/v biases, no Q/K permutation in
// GGUF) loads from GGUF (general.architecture qwen2) and from a Hugging Face
// directory (model_type qwen2) into the same model with bit-identical runs,
// and its biases change the logits (the same weights without them differ).
func TestCrossFormatQwen2(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(map[bool]string{false: "untied", true: "tied"}[tied], func(t *testing.T) {
			m := withQKVBias(newTinyModel(11, tied), 12)
			qwen2 := func(c map[string]any) {
				c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"}
				c["use_sliding_window"], c["sliding_window"], c["max_window_layers"] = false, 131072, 2
				delete(c, "attention_bias")
				delete(c, "mlp_bias")
			}
			gg := writeGGUF(t, m, ggufOptions{arch: "qwen2"})
			hf := writeHF(t, m, hfOptions{config: qwen2, dtype: "BF16"})
			for _, p := range []string{gg, hf} {
				if s := loadOK(t, p).Shape; !s.QKVBias || s.QKNorm {
					t.Fatalf("%s: shape %+v, want qkv_bias without q/k norms", p, s)
				}
			}
			biased := crossCheck(t, gg, hf)
			if !haveEngine() {
				return
			}
			// Zero biases give the Llama reading of the same weights, bit for
			// bit; the drawn ones change the logits.
			zero := withQKVBias(newTinyModel(11, tied), 12)
			for _, x := range zero.tensors {
				if x.kind >= bridge.WeightQBias {
					clear(x.data)
				}
			}
			z := loadOK(t, writeHF(t, zero, hfOptions{config: qwen2}))
			l := loadOK(t, writeHF(t, newTinyModel(11, tied), hfOptions{}))
			prompt := crossPrompt(t, z)
			unbiased := runEngine(t, z, prompt)
			requireSameRun(t, unbiased, runEngine(t, l, prompt))
			differs := false
			for i := range biased.logits[0] {
				differs = differs || biased.logits[0][i] != unbiased.logits[0][i]
			}
			if !differs {
				t.Fatal("the q/k/v biases left the logits unchanged")
			}
		})
	}
}

// TestCrossFormatMistral: a Hugging Face directory of model_type mistral
// (Mistral 7B v0.2/v0.3: a Llama decoder, sliding_window null or as long as
// the context) runs bit-identically to the same weights as llama.
func TestCrossFormatMistral(t *testing.T) {
	m := newTinyModel(13, false)
	llama := writeHF(t, m, hfOptions{})
	for _, window := range []any{nil, 128} {
		mistral := writeHF(t, m, hfOptions{config: func(c map[string]any) {
			c["model_type"], c["architectures"], c["sliding_window"] = "mistral", []string{"MistralForCausalLM"}, window
		}})
		crossCheck(t, llama, mistral)
	}
}

// fused is m with Phi-3's fused projections: q, k and v as one qkv_proj
// (attn_qkv) and gate and up as one gate_up_proj (ffn_up of twice the width).
func fused(m *tinyModel) *tinyModel {
	var out []*tinyTensor
	byKind := map[[2]int]*tinyTensor{}
	for _, x := range m.tensors {
		switch x.kind {
		case bridge.WeightQ, bridge.WeightK, bridge.WeightV, bridge.WeightGate, bridge.WeightUp:
			byKind[[2]int{int(x.kind), x.layer}] = x
			continue
		}
		out = append(out, x)
	}
	for l := 0; l < m.shape.NumLayers; l++ {
		cat := func(hf, gg string, kind bridge.WeightKind, parts ...bridge.WeightKind) {
			t := &tinyTensor{hf: fmt.Sprintf("model.layers.%d.%s", l, hf), gguf: fmt.Sprintf("blk.%d.%s", l, gg), kind: kind, layer: l}
			for _, k := range parts {
				x := byKind[[2]int{int(k), l}]
				t.rows, t.cols, t.data = t.rows+x.rows, x.cols, append(t.data, x.data...)
			}
			out = append(out, t)
		}
		cat("self_attn.qkv_proj.weight", "attn_qkv.weight", weightQKV, bridge.WeightQ, bridge.WeightK, bridge.WeightV)
		cat("mlp.gate_up_proj.weight", "ffn_up.weight", weightGateUp, bridge.WeightGate, bridge.WeightUp)
	}
	m.tensors = out
	return m
}

// TestCrossFormatPhi3: a Phi-3 checkpoint (fused qkv and gate/up
// projections) loads from GGUF (general.architecture phi3) and from a
// Hugging Face directory (model_type phi3) into the same model as the
// unfused weights, and runs bit-identically to them; LongRoPE and partial
// RoPE (Phi-3.5, Phi-4-mini) are TestCrossFormatPhi3LongRoPE's; a sliding
// window shorter than the context is read from both.
func TestCrossFormatPhi3(t *testing.T) {
	phi3 := func(c map[string]any) {
		c["model_type"], c["architectures"], c["sliding_window"] = "phi3", []string{"Phi3ForCausalLM"}, nil
	}
	m := fused(newTinyModel(14, false))
	hf := writeHF(t, m, hfOptions{config: phi3})
	gg := writeGGUF(t, m, ggufOptions{arch: "phi3"})
	plain := writeHF(t, newTinyModel(14, false), hfOptions{})
	ref := crossCheck(t, plain, hf)
	requireSameRun(t, ref, crossCheck(t, plain, gg))
	for _, c := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"longrope without its first context", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": []float64{1}, "short_factor": []float64{1}}
		}, "needs original_max_position_embeddings"},
		{"partial rotary of an odd count", func(c map[string]any) { c["partial_rotary_factor"] = 0.3125 }, "partial_rotary_factor 0.3125"},
	} {
		dir := writeHF(t, m, hfOptions{config: func(cfg map[string]any) { phi3(cfg); c.edit(cfg) }})
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
	// Phi-3 mini 4k's window (2047 of 4096): every layer, from either
	// format (llama.cpp drops it; Hugging Face and vLLM apply it).
	ggw := writeGGUF(t, m, ggufOptions{arch: "phi3", kvs: func(kvs []ggufKV) []ggufKV {
		return append(kvs, ggufKV{"phi3.attention.sliding_window", uint32(64)})
	}})
	hfw := writeHF(t, m, hfOptions{config: func(cfg map[string]any) { phi3(cfg); cfg["sliding_window"] = 64 }})
	for _, p := range []string{ggw, hfw} {
		if s := loadOK(t, p).Shape; s.SlidingWindow != 64 || s.SlidingWindowPattern != 0 {
			t.Fatalf("%s: sliding window 64: shape %+v", p, s)
		}
	}
	crossCheck(t, ggw, hfw)
}

// TestCrossFormatGranite: a Granite checkpoint (a Llama with four
// multipliers) loads its multipliers from GGUF (granite.embedding_scale,
// residual_scale, attention.scale, logit_scale) and from a Hugging Face
// config (embedding_multiplier, residual_multiplier, attention_multiplier,
// logits_scaling) alike, runs bit-identically from both, and differs from
// the same weights as a plain Llama; Granite's fields on another
// model_type are refused.
func TestCrossFormatGranite(t *testing.T) {
	m := newTinyModel(15, true)
	gg := writeGGUF(t, m, ggufOptions{arch: "granite", kvs: func(kvs []ggufKV) []ggufKV {
		return append(kvs, ggufKV{"granite.embedding_scale", float32(12)}, ggufKV{"granite.residual_scale", float32(0.22)},
			ggufKV{"granite.attention.scale", float32(0.125)}, ggufKV{"granite.logit_scale", float32(16)})
	}})
	granite := func(c map[string]any) {
		c["model_type"], c["architectures"] = "granite", []string{"GraniteForCausalLM"}
		c["embedding_multiplier"], c["residual_multiplier"], c["attention_multiplier"], c["logits_scaling"] = 12.0, 0.22, 0.125, 16.0
	}
	hf := writeHF(t, m, hfOptions{config: granite})
	want := bridge.ModelShape{EmbeddingScale: 12, ResidualScale: 0.22, AttentionScale: 0.125, LogitScale: 16}
	for _, p := range []string{gg, hf} {
		s := loadOK(t, p).Shape
		if s.EmbeddingScale != want.EmbeddingScale || s.ResidualScale != want.ResidualScale || s.AttentionScale != want.AttentionScale || s.LogitScale != want.LogitScale {
			t.Fatalf("%s: multipliers %+v", p, s)
		}
	}
	run := crossCheck(t, gg, hf)
	if haveEngine() {
		plain := loadOK(t, writeHF(t, m, hfOptions{}))
		other := runEngine(t, plain, crossPrompt(t, plain))
		same := true
		for i := range run.logits[0] {
			same = same && run.logits[0][i] == other.logits[0][i]
		}
		if same {
			t.Fatal("Granite's multipliers left the logits unchanged")
		}
	}
	bad := writeHF(t, m, hfOptions{config: func(c map[string]any) { c["logits_scaling"] = 16.0 }})
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "Granite's (model_type granite)") {
		t.Fatalf("logits_scaling on llama: %v", err)
	}
}

func TestCrossFormatQ8_0(t *testing.T) {
	for _, tied := range []bool{false, true} {
		name := map[bool]string{false: "untied", true: "tied"}[tied]
		t.Run(name, func(t *testing.T) {
			m := newTinyModel(2, tied)
			m.quantiseProjections()
			gg := writeGGUF(t, m, ggufOptions{})
			hf := writeHF(t, m, hfOptions{}) // F32 of the dequantised values
			requireDTypes(t, gg, func(k bridge.WeightKind) bridge.DType {
				if isProjection(k) {
					return bridge.DTypeQ8_0
				}
				return bridge.DTypeF32
			})
			crossCheck(t, gg, hf)
		})
	}
}

func TestCrossFormatHalfPrecision(t *testing.T) {
	m := newTinyModel(3, false)
	f32 := writeHF(t, m, hfOptions{dtype: "F32"})
	for _, c := range []struct {
		dtype string
		dt    bridge.DType
	}{{"BF16", bridge.DTypeBF16}, {"F16", bridge.DTypeF16}} {
		t.Run(c.dtype, func(t *testing.T) {
			half := writeHF(t, m, hfOptions{dtype: c.dtype})
			requireDTypes(t, half, allDType(c.dt))
			crossCheck(t, f32, half)
		})
	}
}

func TestCrossFormatRopeScaling(t *testing.T) {
	m := newTinyModel(4, false)
	plain := writeHF(t, m, hfOptions{})
	want := &bridge.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	m.shape.RopeScaling = want
	f32 := writeHF(t, m, hfOptions{})
	bf16 := writeHF(t, m, hfOptions{dtype: "BF16"})
	if s := loadOK(t, f32).Shape; !reflect.DeepEqual(s.RopeScaling, want) {
		t.Fatalf("rope scaling %+v, want %+v", s.RopeScaling, want)
	}
	if s := loadOK(t, plain).Shape; s.RopeScaling != nil {
		t.Fatalf("unscaled checkpoint loaded with rope scaling %+v", s.RopeScaling)
	}
	scaled := crossCheck(t, f32, bf16)
	p := loadOK(t, plain)
	if !haveEngine() {
		t.Skip("built without the native engine (go test -tags native)")
	}
	unscaled := runEngine(t, p, crossPrompt(t, p))
	// The prefill's last position is ~20: the scaled low frequencies must
	// change its logits.
	same := true
	for i := range scaled.logits[0] {
		same = same && scaled.logits[0][i] == unscaled.logits[0][i]
	}
	if same {
		t.Fatal("llama3 rope_scaling left the logits unchanged")
	}
}

func TestLoadRefusals(t *testing.T) {
	m := newTinyModel(5, false)
	cfg := func(k string, v any) hfOptions {
		return hfOptions{config: func(c map[string]any) { c[k] = v }}
	}
	edit := func(f func(shard int, ts []stTensor) []stTensor) hfOptions { return hfOptions{edit: f} }
	for _, c := range []struct {
		name string
		path func(t *testing.T) string
		want []string
	}{
		{"olmo2", func(t *testing.T) string { return writeHF(t, m, cfg("model_type", "olmo2")) }, []string{`model_type "olmo2"`, "llama"}},
		{"mistral sliding window", func(t *testing.T) string {
			return writeHF(t, m, hfOptions{config: func(c map[string]any) { c["model_type"], c["sliding_window"] = "mistral", -64 }})
		}, []string{"sliding_window -64 is not a positive integer"}},
		{"qwen2 without biases", func(t *testing.T) string { return writeHF(t, m, cfg("model_type", "qwen2")) }, []string{"missing tensor: layer 0 q projection bias"}},
		{"qwen2 sliding window", func(t *testing.T) string {
			return writeHF(t, m, hfOptions{config: func(c map[string]any) { c["model_type"], c["use_sliding_window"] = "qwen2", true }})
		}, []string{"use_sliding_window", "not supported"}},
		{"head_dim", func(t *testing.T) string { return writeHF(t, m, cfg("head_dim", 32)) }, []string{"model.layers.0.self_attn.q_proj.weight", "[64][64]", "[128][64]"}},
		{"missing shard", func(t *testing.T) string {
			dir := writeHF(t, m, hfOptions{})
			if err := os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, []string{"model-00002-of-00002.safetensors"}},
		{"I32 tensor", func(t *testing.T) string {
			return writeHF(t, m, edit(func(_ int, ts []stTensor) []stTensor {
				for i := range ts {
					if ts[i].name == "model.layers.0.self_attn.q_proj.weight" {
						ts[i].dtype = "I32"
					}
				}
				return ts
			}))
		}, []string{"model.layers.0.self_attn.q_proj.weight", "I32"}},
		{"bias", func(t *testing.T) string {
			return writeHF(t, m, edit(func(shard int, ts []stTensor) []stTensor {
				if shard == 0 {
					ts = append(ts, stTensor{"model.layers.0.self_attn.q_proj.bias", "F32", []int{64}, make([]byte, 256)})
				}
				return ts
			}))
		}, []string{"model.layers.0.self_attn.q_proj.bias", "not part of a llama decoder"}},
		{"missing layer tensor", func(t *testing.T) string {
			return writeHF(t, m, edit(func(_ int, ts []stTensor) []stTensor {
				return slices.DeleteFunc(ts, func(x stTensor) bool { return x.name == "model.layers.1.mlp.down_proj.weight" })
			}))
		}, []string{"missing tensor: layer 1 down projection"}},
		{"gguf qwen2 without biases", func(t *testing.T) string { return writeGGUF(t, m, ggufOptions{arch: "qwen2"}) }, []string{"missing tensor: layer 0 q projection bias"}},
		{"gguf qwen2moe", func(t *testing.T) string { return writeGGUF(t, m, ggufOptions{arch: "qwen2moe"}) }, []string{`architecture "qwen2moe"`}},
		{"gguf Q4_K", func(t *testing.T) string {
			return writeGGUF(t, m, ggufOptions{typeOverride: map[string]struct {
				typ      uint32
				rowBytes int
			}{"blk.0.attn_q.weight": {ggmlQ4_K, 144 * 64 / 256}}})
		}, []string{"blk.0.attn_q.weight", "Q4_K rows need a multiple of 256"}},
		{"gguf IQ4_XS", func(t *testing.T) string {
			return writeGGUF(t, m, ggufOptions{typeOverride: map[string]struct {
				typ      uint32
				rowBytes int
			}{"blk.0.attn_q.weight": {23, 136 * 64 / 256}}})
		}, []string{"blk.0.attn_q.weight", "IQ4_XS", "supported: F32"}},
		{"gguf truncated", func(t *testing.T) string {
			path := writeGGUF(t, m, ggufOptions{})
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, st.Size()-1000); err != nil {
				t.Fatal(err)
			}
			return path
		}, []string{"truncated"}},
		{"gguf truncated header", func(t *testing.T) string {
			path := writeGGUF(t, m, ggufOptions{})
			if err := os.Truncate(path, 200); err != nil {
				t.Fatal(err)
			}
			return path
		}, []string{"reading GGUF"}},
		{"not gguf", func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "weights.bin")
			if err := os.WriteFile(path, []byte("PK\x03\x04 not a checkpoint"), 0o644); err != nil {
				t.Fatal(err)
			}
			return path
		}, []string{"not a GGUF file", "not a directory"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			got, err := Load(path)
			if err == nil {
				got.Close()
				t.Fatalf("Load accepted %s", path)
			}
			if got != nil {
				t.Errorf("Load returned a model with its error")
			}
			t.Log(err)
			msg := strings.ReplaceAll(err.Error(), path, "PATH") // the temporary path names the case
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// The unedited checkpoints load (the refusals are the edits').
	loadOK(t, writeHF(t, m, hfOptions{}))
	loadOK(t, writeGGUF(t, m, ggufOptions{}))
}

// llama3Divisors are the per-dimension divisors llama.cpp's converter
// writes as rope_freqs.weight for a Llama-3 rope_scaling: the unscaled
// inverse frequency over the scaled one, in float32.
func llama3Divisors(s bridge.ModelShape, r bridge.RopeScaling) []float32 {
	half := s.HeadDim / 2
	out := make([]float32, half)
	lowWave := float64(r.OriginalMaxPositions) / float64(r.LowFreqFactor)
	highWave := float64(r.OriginalMaxPositions) / float64(r.HighFreqFactor)
	for i := range out {
		inv := math.Pow(float64(s.RopeTheta), -2*float64(i)/float64(s.HeadDim))
		wave := 2 * math.Pi / inv
		scaled := inv
		switch {
		case wave < highWave:
		case wave > lowWave:
			scaled = inv / float64(r.Factor)
		default:
			smooth := (float64(r.OriginalMaxPositions)/wave - float64(r.LowFreqFactor)) / float64(r.HighFreqFactor-r.LowFreqFactor)
			scaled = (1-smooth)*inv/float64(r.Factor) + smooth*inv
		}
		out[i] = float32(inv / scaled)
	}
	return out
}

// TestGGUFRopeFreqs: a Llama 3.1-style GGUF (rope_freqs.weight) loads; all
// divisors 1 change nothing, bit for bit; the divisors of a llama3
// rope_scaling give the scaled Hugging Face checkpoint's greedy tokens and
// logits within 1e-4 (the float32 divisors round the frequencies).
func TestGGUFRopeFreqs(t *testing.T) {
	m := newTinyModel(6, false)
	plain := writeGGUF(t, m, ggufOptions{})
	ones := make([]float32, m.shape.HeadDim/2)
	for i := range ones {
		ones[i] = 1
	}
	withOnes := writeGGUF(t, m, ggufOptions{ropeFreqs: ones})
	r := bridge.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	withLlama3 := writeGGUF(t, m, ggufOptions{ropeFreqs: llama3Divisors(m.shape, r)})
	m.shape.RopeScaling = &r
	hf := writeHF(t, m, hfOptions{})

	g := loadOK(t, withLlama3)
	found := false
	for _, x := range g.Tensors {
		found = found || x.Kind == bridge.WeightRopeFreqs
	}
	if !found {
		t.Fatal("rope_freqs.weight was not loaded")
	}
	if !haveEngine() {
		t.Skip("built without the native engine (go test -tags native)")
	}
	p, o := loadOK(t, plain), loadOK(t, withOnes)
	rp, ro := runEngine(t, p, crossPrompt(t, p)), runEngine(t, o, crossPrompt(t, o))
	if !reflect.DeepEqual(rp, ro) {
		t.Fatal("rope_freqs of ones changed the tokens or logits")
	}
	a, b := loadOK(t, withLlama3), loadOK(t, hf)
	ra, rb := runEngine(t, a, crossPrompt(t, a)), runEngine(t, b, crossPrompt(t, b))
	if !reflect.DeepEqual(ra.sampled, rb.sampled) {
		t.Fatalf("greedy tokens %v (rope_freqs) vs %v (rope_scaling)", ra.sampled, rb.sampled)
	}
	worst := 0.0
	for s := range ra.logits {
		for i := range ra.logits[s] {
			worst = math.Max(worst, math.Abs(float64(ra.logits[s][i]-rb.logits[s][i])))
		}
	}
	t.Logf("max |Δlogit| rope_freqs vs rope_scaling: %.2e", worst)
	if worst > 1e-4 {
		t.Fatalf("max |Δlogit| %.2e > 1e-4", worst)
	}
}
