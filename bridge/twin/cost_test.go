package twin

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/stretchr/testify/require"
)

// Rates and coefficients of the built-in h200 profile, written out so that
// the expected values below are computed from the datasheet and the
// coefficients (docs/twin.md), not from the code under test.
const (
	h200BF16    = 989.5e12         // FLOP/s dense
	h200FP8     = 1979e12          // FLOP/s dense
	h200HBM     = 4.8e12           // B/s
	h200NVDir   = 450e9            // B/s, one direction
	gemmRate    = h200BF16 * 0.72  // 712.44e12 FLOP/s
	fp8GemmRate = h200FP8 * 0.68   // 1345.72e12 FLOP/s
	weightRate  = h200HBM * 0.94   // 4.512e12 B/s
	attnRate    = h200BF16 * 0.65  // 643.175e12 FLOP/s
	kvRate      = h200HBM * 0.80   // 3.84e12 B/s
	elemRate    = h200HBM * 0.72   // 3.456e12 B/s
	a2aRate     = h200NVDir * 0.75 // 337.5e9 B/s
	arRate      = h200NVDir * 1.52 // 684e9 B/s ring bus bandwidth of an all-reduce
	tile        = 64               // tokens per GEMM tile
	gemmK       = 0.005            // ms per GEMM kernel
	attnK       = 0.012            // ms per attention kernel
	elemK       = 0.003            // ms per element-wise kernel
	arLat       = 0.025            // ms per all-reduce
)

func ms(seconds float64) float64 { return seconds * 1e3 }

// gemmMS is one GEMM of rows tokens through a k×n matrix, as docs/twin.md
// writes it: the kernel's fixed cost plus the hypotenuse of the compute time
// of the rows rounded up to whole tiles and the time to stream the weights
// (wb bytes each), the input (wb bytes per element) and the BF16 output.
func gemmMS(rows, k, n, wb, rate float64) float64 {
	padded := math.Ceil(rows/tile) * tile
	c := ms(2 * padded * k * n / rate)
	b := ms((k*n*wb + rows*(k*wb+n*2)) / weightRate)
	return gemmK + math.Hypot(c, b)
}

// llama-8b: hidden 4096, 32 heads, 8 KV heads, head dim 128, intermediate
// 14336, vocab 128256, 32 layers. Its layer's GEMMs: QKV 4096×6144, O
// 4096×4096, gate+up 4096×28672, down 14336×4096.
func l8LayerGEMM(rows, wb, rate float64) float64 {
	return gemmMS(rows, 4096, 6144, wb, rate) + gemmMS(rows, 4096, 4096, wb, rate) +
		gemmMS(rows, 4096, 28672, wb, rate) + gemmMS(rows, 14336, 4096, wb, rate)
}

const (
	// KV bytes per token and layer: 2·8·128·2.
	l8KVLayer = 4096
	// Element-wise bytes per token and layer: norms 8·4096·2 = 65,536, RoPE
	// on q and k 2·(32+8)·128·2 = 20,480, KV append 4,096, SiLU·mul
	// 3·14336·2 = 86,016; four kernels.
	l8ElemLayer = 65536 + 20480 + 4096 + 86016 // 176,128
	// Outside the layers: embedding gather 4096·2 + 4096·2, final norm
	// 2·4096·2, a kernel each.
	l8ElemEmbed, l8ElemFinal = 16384, 16384
	// LM head 4096×128256; logits 2·128256·4 bytes per sequence.
	l8Logits = 2 * 128256 * 4
)

// l8Norm is the element-wise time of T tokens.
func l8Norm(T float64) float64 {
	return 32*(4*elemK+ms(T*l8ElemLayer/elemRate)) + 2*elemK + ms(T*(l8ElemEmbed+l8ElemFinal)/elemRate)
}

// l8LM is the LM head of ns sequences and the sampler's logits traffic.
func l8LM(ns float64) float64 {
	return gemmMS(ns, 4096, 128256, 2, gemmRate) + elemK + ms(ns*l8Logits/elemRate)
}

// approx checks a total written as a rounded decimal (7 significant digits).
func approx(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6*math.Abs(want) {
		t.Errorf("%s = %.9g ms, want ≈ %.7g ms", what, got, want)
	}
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g ms, want %.12g ms", what, got, want)
	}
}

func builtin(t testing.TB, gpu, model string, par Parallelism) *Profile {
	t.Helper()
	p, err := BuiltinProfile(gpu, model, par)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLlama8BDecodeH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	c := p.StepCost([]Work{{NewTokens: 1, KVBefore: 4096}})
	// GEMMs read every weight once (218,103,808 per layer at 4.512 TB/s =
	// 96.7 us), plus the compute of one 64-token tile (2·64·218e6 FLOP at
	// 712 TFLOP/s = 39.2 us) in quadrature and 4 x 5 us of kernel costs:
	// ~124 us per layer, 3.97 ms in all.
	near(t, "GEMM", c.GEMMMS, 32*l8LayerGEMM(1, 2, gemmRate))
	// Attention per layer: the decode kernel's 12 us plus 4097 tokens ·
	// 4096 B = 16.8 MB at 3.84 TB/s = 4.37 us (FLOPs 4·32·128·4096.5 = 67
	// MFLOP at 643 TFLOP/s = 0.10 us); 32 layers: 0.5238 ms.
	near(t, "attention", c.AttentionMS, 32*(attnK+ms(4097*l8KVLayer/kvRate)))
	near(t, "norm", c.NormMS, l8Norm(1))
	near(t, "LM head", c.LMHeadMS, l8LM(1))
	// A pure decode replays a CUDA graph: 0.1 + 32·0.008 ms.
	near(t, "overhead", c.OverheadMS, 0.1+32*0.008)
	approx(t, "MS", c.MS(), 5.510150)
}

func TestLlama8BChunkH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	// 512 tokens: compute-bound GEMMs (2·512·6.98e9 FLOP at 712 TFLOP/s =
	// 10.03 ms) with the weights' and activations' 3.6 ms in quadrature
	// (per matrix) and 128 kernels' 0.64 ms: 11.30 ms.
	gemm := 32 * l8LayerGEMM(512, 2, gemmRate)
	ovh := 0.1 + 32*0.02 // not a graph
	for _, tc := range []struct {
		kv   int
		attn float64
		want float64
	}{
		// kv 0: 512·(0 + 256) = 131,072 pairs · 4·32·128 FLOP = 2.15 GFLOP
		// per layer at 643.175 TFLOP/s = 3.339 us, plus the kernel's 12 us.
		{0, 32 * (attnK + ms(512*256*16384/attnRate)), 14.01837},
		// kv 8192: 512·(8192 + 256) = 4,325,376 pairs = 70.9 GFLOP per
		// layer = 0.11018 ms, plus 12 us; 32 layers = 3.9098 ms.
		{8192, 32 * (attnK + ms(512*8448*16384/attnRate)), 17.43739},
	} {
		c := p.StepCost([]Work{{NewTokens: 512, KVBefore: tc.kv}})
		near(t, "GEMM", c.GEMMMS, gemm)
		near(t, "attention", c.AttentionMS, tc.attn)
		near(t, "norm", c.NormMS, l8Norm(512))
		near(t, "LM head", c.LMHeadMS, l8LM(1))
		near(t, "overhead", c.OverheadMS, ovh)
		approx(t, "MS", c.MS(), tc.want)
	}
}

func TestLlama8BMixedBatchH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	// Two decodes (kv 4096 and 1000) and a 512-token chunk at kv 2048:
	// 514 tokens, 3 sequences.
	c := p.StepCost([]Work{{NewTokens: 1, KVBefore: 4096}, {NewTokens: 1, KVBefore: 1000}, {NewTokens: 512, KVBefore: 2048}})
	// Context kernel per layer: 512·(2048+256) = 1,179,648 pairs · 16384 FLOP
	// = 19.3 GFLOP at 643.175 TFLOP/s = 30.05 us (KV read 2560·4096 B =
	// 2.7 us) + 12 us. Decode kernel: (4097 + 1001)·4096 B at 3.84e12 =
	// 5.44 us + 12 us. 32 layers.
	attn := 32 * (attnK + ms(512*2304*16384/attnRate) + attnK + ms((4097+1001)*l8KVLayer/kvRate))
	near(t, "attention", c.AttentionMS, attn)
	near(t, "GEMM", c.GEMMMS, 32*l8LayerGEMM(514, 2, gemmRate))
	near(t, "norm", c.NormMS, l8Norm(514))
	near(t, "LM head", c.LMHeadMS, l8LM(3))
	near(t, "overhead", c.OverheadMS, 0.74)
	if c.Tokens != 514 || c.Seqs != 3 {
		t.Errorf("tokens, seqs = %d, %d; want 514, 3", c.Tokens, c.Seqs)
	}
	approx(t, "MS", c.MS(), 16.62352)
}

// TestGEMMTransition: a GEMM's time is the larger of compute and memory
// where one dominates, √2 times either where they are equal (the 64-512
// token transition the old max() roofline made 16-42 % too fast), and its
// arithmetic counts whole 64-token tiles.
func TestGEMMTransition(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	const k, n = 4096, 28672
	at := func(rows int) float64 { return p.GEMMMS(rows, k, n, BF16) - gemmK }
	mem := func(rows float64) float64 { return ms((k*n*2 + rows*(k*2+n*2)) / weightRate) }
	comp := func(rows float64) float64 { return ms(2 * math.Ceil(rows/tile) * tile * k * n / gemmRate) }
	for _, rows := range []int{1, 64, 128, 256, 512, 4096} {
		got, c, m := at(rows), comp(float64(rows)), mem(float64(rows))
		if got < math.Max(c, m) || got > math.Sqrt2*math.Max(c, m)+1e-12 {
			t.Errorf("%d rows: %.5f ms outside [max, √2·max] of compute %.5f and memory %.5f", rows, got, c, m)
		}
	}
	// 1 and 64 rows pay the same tile; 65 pays two.
	if at(1) >= at(64) || at(65)-at(64) < 0.5*(comp(65)-comp(64))*comp(65)/at(65) {
		t.Errorf("tile quantization: 1 row %.5f, 64 rows %.5f, 65 rows %.5f ms", at(1), at(64), at(65))
	}
	// FP8 weights: half the bytes at decode size, the FP8 rate at prefill size.
	if r := p.GEMMMS(1, k, n, FP8) / p.GEMMMS(1, k, n, BF16); r < 0.5 || r > 0.62 {
		t.Errorf("FP8/BF16 at 1 row = %.3f, want ~0.5-0.6 (half the weight bytes, fixed kernel cost)", r)
	}
	if r, want := (p.GEMMMS(8192, k, n, FP8)-gemmK)/(p.GEMMMS(8192, k, n, BF16)-gemmK), gemmRate/fp8GemmRate; math.Abs(r-want) > 0.01 {
		t.Errorf("FP8/BF16 at 8192 rows = %.3f, want ≈ %.3f (the two compute rates)", r, want)
	}
}

// TestFixedKernelCosts: a short prompt's time is bounded below by its
// kernels' fixed costs (a batch-1 decode at 128 tokens of KV pays the
// attention kernel's 12 us per layer, not its 0.2 us of traffic).
func TestFixedKernelCosts(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	lc, err := p.LayerCosts([]Work{{NewTokens: 1, KVBefore: 128}})
	if err != nil {
		t.Fatal(err)
	}
	near(t, "decode attention", lc.AttentionMS, attnK+ms(129*l8KVLayer/kvRate))
	near(t, "element-wise", lc.ElementwiseMS, 4*elemK+ms(l8ElemLayer/elemRate))
	if lc.GEMMMS < 4*gemmK {
		t.Errorf("GEMMs %.4f ms below their four kernels' fixed cost", lc.GEMMMS)
	}
	if _, err := p.LayerCosts(nil); err != nil {
		t.Error(err)
	}
}

// TestFP8Deployment: FP8 weights run the GEMMs at the FP8 rate and halve
// the weight bytes; an FP8 KV cache halves the KV bytes per token, so more
// than twice the pages fit (the weights shrink too).
func TestFP8Deployment(t *testing.T) {
	bf := builtin(t, "h200", "llama-8b", Parallelism{})
	fp, err := bf.WithDTypes(FP8, FP8)
	if err != nil {
		t.Fatal(err)
	}
	if fp.Model.WeightBytes != 1 || fp.Model.KVBytes != 1 || fp.Model.EmbeddingBytes != 2 || bf.Model.WeightBytes != 2 {
		t.Errorf("dtypes: fp8 copy %+v, original weight bytes %g", fp.Model, bf.Model.WeightBytes)
	}
	near(t, "KV bytes per token", fp.KVBytesPerToken(), bf.KVBytesPerToken()/2)
	pb, _ := bf.PoolPages(32)
	pf, _ := fp.PoolPages(32)
	if pf < 2*pb {
		t.Errorf("FP8 pool %d pages, BF16 %d: FP8 KV must fit at least twice as many", pf, pb)
	}
	w := []Work{{NewTokens: 4096, KVBefore: 0}}
	if r, want := fp.StepCost(w).GEMMMS/bf.StepCost(w).GEMMMS, gemmRate/fp8GemmRate; math.Abs(r-want) > 0.02 {
		t.Errorf("4096-token chunk: FP8/BF16 GEMM time %.3f, want ≈ %.3f", r, want)
	}
	if _, err := ParseDType("fp4"); err == nil || err.Error() != `unknown dtype "fp4" (allowed: bf16, fp8, nvfp4 (weights only))` {
		t.Errorf("ParseDType(fp4) = %v", err)
	}
	lin, _ := NewLinearProfile(ModelFromShape("tiny", bridge.Presets["tiny"]), LinearCoefficients{1, 0, 0, 0, 0}, "t")
	if _, err := lin.WithDTypes(FP8, ""); err == nil {
		t.Error("a linear profile has no dtypes")
	}
	same, _ := bf.WithDTypes("", "")
	w = []Work{{NewTokens: 1, KVBefore: 100}, {NewTokens: 300, KVBefore: 0}}
	if same.StepCost(w) != bf.StepCost(w) {
		t.Error("empty dtypes must keep the model's")
	}
}

// TestNVFP4Deployment: NVFP4 weights (4.5 bits an element) on a Blackwell
// GPU shrink the weights to 0.5625 of FP8's, so more KV pages fit, and run
// large GEMMs at the FP4 rate; Hopper has no FP4 tensor cores and a KV cache
// is never NVFP4.
func TestNVFP4Deployment(t *testing.T) {
	base, err := builtin(t, "b200", "deepseek-v3", Parallelism{}).WithRanks(8)
	require.NoError(t, err)
	f8, err := base.WithDTypes(FP8, FP8)
	require.NoError(t, err)
	f4, err := base.WithDTypes(NVFP4, FP8)
	require.NoError(t, err)
	require.Equal(t, 0.5625, f4.Model.WeightBytes)
	require.Equal(t, 2, f4.Model.EmbeddingBytes, "the embedding and LM head stay BF16")
	w8, w4 := f8.WeightBytesPerGPU(), f4.WeightBytesPerGPU()
	require.Less(t, w4, 0.6*w8, "NVFP4 linear weights are 0.5625 of FP8's")
	p8, err := f8.PoolPages(32)
	require.NoError(t, err)
	p4, err := f4.PoolPages(32)
	require.NoError(t, err)
	require.Greater(t, p4, p8, "the room NVFP4 weights leave goes to the KV cache")
	big := []Work{{NewTokens: 8192, KVBefore: 0}}
	r := f4.StepCost(big).GEMMMS / f8.StepCost(big).GEMMMS
	require.Less(t, r, 0.75, "an 8 192-token chunk's GEMMs run at the FP4 rate: twice FP8's peak at 0.47 of it "+
		"against 0.68 (0.72 of FP8's time), less the fixed costs")
	require.Less(t, f4.GEMMMS(4096, 7168, 18432, NVFP4), f4.GEMMMS(4096, 7168, 18432, FP8))
	require.Contains(t, f4.Model.Source, "weights nvfp4")

	_, err = builtin(t, "h200", "llama-8b", Parallelism{}).WithDTypes(NVFP4, "")
	require.ErrorContains(t, err, "nvfp4 weights need FP4 tensor cores, which the h200 has not")
	_, err = base.WithDTypes("", NVFP4)
	require.ErrorContains(t, err, "the twin's KV cache is bf16 or fp8, not nvfp4")
	d, err := ParseDType(" NVFP4 ")
	require.NoError(t, err)
	require.Equal(t, NVFP4, d)
}

// TestFP4GEMMEfficiencyOptional: fp4_gemm_efficiency may be left out of a
// profile file (one written before the key existed): NVFP4 GEMMs then run
// at fp8_gemm_efficiency; given, it is checked like every efficiency.
func TestFP4GEMMEfficiencyOptional(t *testing.T) {
	p, err := builtin(t, "b200", "llama-70b", Parallelism{}).WithDTypes(NVFP4, FP8)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, p.WriteJSON(&buf))
	require.Contains(t, buf.String(), `"fp4_gemm_efficiency"`)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &doc))
	delete(doc["roofline"].(map[string]any), "fp4_gemm_efficiency")
	old, err := json.Marshal(doc)
	require.NoError(t, err)
	q, err := ReadProfile(bytes.NewReader(old))
	require.NoError(t, err)
	want := p.clone()
	want.Roofline.FP4GEMMEfficiency = p.Roofline.FP8GEMMEfficiency
	require.NoError(t, want.Validate())
	require.Equal(t, want.GEMMMS(4096, 8192, 28672, NVFP4), q.GEMMMS(4096, 8192, 28672, NVFP4))
	require.Greater(t, q.GEMMMS(4096, 8192, 28672, NVFP4), 0.0)
	require.Less(t, q.GEMMMS(4096, 8192, 28672, NVFP4), p.GEMMMS(4096, 8192, 28672, NVFP4),
		"without the key NVFP4 runs at FP8's 0.68, faster than the fitted 0.47")

	doc["roofline"].(map[string]any)["fp4_gemm_efficiency"] = map[string]any{"value": 1.5, "source": "x"}
	bad, err := json.Marshal(doc)
	require.NoError(t, err)
	_, err = ReadProfile(bytes.NewReader(bad))
	require.ErrorContains(t, err, "roofline.fp4_gemm_efficiency.value must be in (0, 1]")
}

func TestTensorParallelSplitsWorkAndAddsAllReduce(t *testing.T) {
	p1 := builtin(t, "h200", "llama-70b", Parallelism{TP: 1})
	p2 := builtin(t, "h200", "llama-70b", Parallelism{TP: 2})
	w := []Work{{NewTokens: 2048, KVBefore: 0}}
	c1, c2 := p1.StepCost(w), p2.StepCost(w)
	if r := c2.GEMMMS / c1.GEMMMS; r < 0.5 || r > 0.52 {
		t.Errorf("GEMM TP2/TP1 = %.3f, want just above 0.5 (each GPU half the weights, same kernels)", r)
	}
	// Attention halves but for the kernels' fixed cost.
	near(t, "attention halves", c2.AttentionMS-80*attnK, (c1.AttentionMS-80*attnK)/2)
	if c1.CommMS != 0 {
		t.Errorf("tp 1 has no all-reduce, got %v ms", c1.CommMS)
	}
	// Two all-reduces per layer of 2048 rows of 8192·2 B: 2·(2−1)/2 of
	// 33.5 MB at 684 GB/s (Vidur's DGX H100 rate) + 25 us = 0.0741 ms each;
	// 160 of them.
	near(t, "all-reduce", c2.CommMS, 160*(ms(1*2048*8192*2/arRate)+arLat))
}

// TestTensorParallelAcrossNodes: a TP group wider than an NVLink domain
// reduces over the network too (hierarchically: NVLink inside each domain,
// RDMA between them), which costs more than the same group in one domain.
func TestTensorParallelAcrossNodes(t *testing.T) {
	one := builtin(t, "h200", "llama-70b", Parallelism{TP: 16, GPUsPerNode: 16})
	two := builtin(t, "h200", "llama-70b", Parallelism{TP: 16})
	if two.Parallelism.GPUsPerNode != 8 {
		t.Fatalf("h200 default gpus per node %d, want 8", two.Parallelism.GPUsPerNode)
	}
	w := []Work{{NewTokens: 1024, KVBefore: 0}}
	c1, c2 := one.StepCost(w), two.StepCost(w)
	// Per token: 2·7/8 of 16 KB over NVLink + 2·1/2·16 KB/8 over RDMA at
	// 50 GB/s · 0.86, plus 25 + 10 us.
	row := 8192.0 * 2
	per := ms(2*7.0/8*row/arRate) + ms(row/8/(50e9*0.86))
	near(t, "two-node all-reduce", c2.CommMS, 160*(1024*per+arLat+0.010))
	if c2.CommMS <= c1.CommMS {
		t.Errorf("all-reduce across two domains %.3f ms must cost more than within one %.3f ms", c2.CommMS, c1.CommMS)
	}
	if gb300 := builtin(t, "gb300", "llama-70b", Parallelism{TP: 16}); gb300.Parallelism.GPUsPerNode != 72 {
		t.Errorf("gb300 default gpus per node %d, want 72 (NVL72)", gb300.Parallelism.GPUsPerNode)
	}
}

// DeepSeek-V3 on h200, EP 8 (one node): 256 routed experts, 32 per GPU,
// top-8, hidden 7168, expert width 2048, 58 MoE layers, FP8 weights.
const (
	dsHidden, dsWidth = 7168.0, 2048.0
	dsExpert          = 3 * dsHidden * dsWidth // 44,040,192 weights
	// DeepEP's rows: FP8 dispatch with one FP32 scale per 128 channels,
	// BF16 combine.
	dsDispatchRow = dsHidden + dsHidden/128*4 // 7,392 B
	dsCombineRow  = dsHidden * 2              // 14,336 B
)

// hitGPU is P(a token's top-k experts include one of the n experts of a
// GPU), experts drawn without replacement from E.
func hitGPU(E, n, k float64) float64 {
	miss := 1.0
	for i := 0.0; i < k; i++ {
		miss *= (E - n - i) / (E - i)
	}
	return 1 - miss
}

// TestDeepEPDispatchBytes: a token goes once to each GPU holding one of its
// experts, in FP8; the combine returns BF16 from the same GPUs. At EP 8,
// 256 experts, top-8 a token reaches 7·0.66 = 4.6 other GPUs: 34 KB of
// dispatch and 66 KB of combine against the 100 KB each way of eight BF16
// copies (2.9x and 1.5x less).
func TestDeepEPDispatchBytes(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	md := &p.d.moeD
	hit := hitGPU(256, 32, 8)
	near(t, "other GPUs reached", md.destIntra, 7*hit)
	near(t, "no network inside one node", md.destInter, 0)
	near(t, "dispatch row", md.rowDispatch, dsDispatchRow)
	old := 8 * dsHidden * 2 * 7 / 8 // top-k BF16 copies, 7/8 of them leave the GPU
	if r := old / (md.destIntra * md.rowDispatch); r < 2.8 || r > 3.0 {
		t.Errorf("dispatch: eight BF16 copies / DeepEP = %.2f, want ~2.9", r)
	}
	if r := old / (md.destIntra * md.rowCombine); r < 1.45 || r > 1.6 {
		t.Errorf("combine: eight BF16 copies / DeepEP = %.2f, want ~1.5", r)
	}
	// One MoE layer of a 1024-token fleet, rank 0 with all of them: the
	// sender's 1024·4.6 rows bound both phases over NVLink at 337.5 GB/s,
	// plus 15 us each.
	_, a2a := p.d.moeLayer(1024, 1024)
	send := 1024 * 7 * hit
	near(t, "dispatch + combine", a2a, ms(send*dsDispatchRow/a2aRate)+0.015+ms(send*dsCombineRow/a2aRate)+0.015)
}

// TestNetworkBetweenNodes: beyond one node the dispatch and combine to
// other nodes cross RDMA (50 GB/s per GPU at 86 %), so 16 ranks on two
// 8-GPU nodes pay more per token than 16 ranks in one 16-GPU domain, and a
// 64-rank fleet's cross-node share dominates.
func TestNetworkBetweenNodes(t *testing.T) {
	base := builtin(t, "h200", "deepseek-v3", Parallelism{})
	two, err := base.WithRanks(16)
	if err != nil {
		t.Fatal(err)
	}
	one, err := two.WithTopology(16)
	if err != nil {
		t.Fatal(err)
	}
	hit := hitGPU(256, 16, 8)
	near(t, "intra-node destinations", two.d.moeD.destIntra, 7*hit)
	near(t, "inter-node destinations", two.d.moeD.destInter, 8*hit)
	near(t, "one domain", one.d.moeD.destIntra, 15*hit)
	_, a2aTwo := two.d.moeLayer(16*256, 256)
	_, a2aOne := one.d.moeLayer(16*256, 256)
	// Two nodes: the RDMA share bounds (8·hit rows of 256 tokens at
	// 43 GB/s) against 7·hit rows at 337.5 GB/s over NVLink.
	rd := func(row float64) float64 { return ms(256*8*hit*row/(50e9*0.86)) + 0.015 + 0.010 }
	near(t, "two-node a2a", a2aTwo, rd(dsDispatchRow)+rd(dsCombineRow))
	if a2aTwo < 3*a2aOne {
		t.Errorf("a2a over two nodes %.3f ms, in one domain %.3f ms: the network should cost several times NVLink", a2aTwo, a2aOne)
	}
	if _, err := base.WithTopology(-1); err == nil {
		t.Error("negative gpus per node must be refused")
	}
}

// TestExpertZipf: skewed routing loads the hottest GPU with more than its
// 1/EP of the rows, so the experts' time grows with the skew; 0 is the
// uniform model exactly.
func TestExpertZipf(t *testing.T) {
	base := builtin(t, "h200", "deepseek-v3", Parallelism{})
	uni, _ := base.WithExpertZipf(0)
	w := []Work{{NewTokens: 2048, KVBefore: 0}, {NewTokens: 1, KVBefore: 4000}}
	if uni.StepCost(w) != base.StepCost(w) {
		t.Error("zipf 0 must be the uniform model")
	}
	near(t, "uniform hot share", base.d.moeD.hotShare, 1.0/8)
	prev := base.StepCost(w).MoEMS
	for _, s := range []float64{0.5, 1, 1.5} {
		q, err := base.WithExpertZipf(s)
		if err != nil {
			t.Fatal(err)
		}
		if q.d.moeD.hotShare <= 1.0/8 {
			t.Errorf("zipf %g: hottest GPU's share %.4f not above 1/8", s, q.d.moeD.hotShare)
		}
		moe := q.StepCost(w).MoEMS
		if moe <= prev {
			t.Errorf("zipf %g: experts %.3f ms, not above %.3f ms at less skew", s, moe, prev)
		}
		prev = moe
	}
	shares := expertShares(256, 1)
	var sum float64
	for _, s := range shares {
		sum += s
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Errorf("expert shares sum to %v", sum)
	}
	if _, err := base.WithExpertZipf(5); err == nil {
		t.Error("zipf 5 must be refused")
	}
}

func TestDeepSeekFleetLockstep(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	// Rank 0 prefills a 1024-token chunk at depth 16384; ranks 1-7 each
	// decode 64 sequences at depth 4096. Fleet: 1024 + 7·64 = 1472 tokens.
	ranks := make([]StepCost, 8)
	ranks[0] = p.StepCost([]Work{{NewTokens: 1024, KVBefore: 16384}})
	decodes := make([]Work, 64)
	for i := range decodes {
		decodes[i] = Work{NewTokens: 1, KVBefore: 4096}
	}
	for r := 1; r < 8; r++ {
		ranks[r] = p.StepCost(decodes)
	}
	// The experts of 1472 tokens on one GPU: 1472·8/8 rows over its 32
	// experts (all hit: 1 − (31/32)^1472 ≈ 1), two grouped FP8 GEMMs of 23
	// tiles... bounded by the experts' 1.41 GB of weights at 4.512 TB/s in
	// quadrature with the FP8 compute, plus the SiLU·mul.
	moe, a2a := p.d.moeLayer(1472, 1024)
	rows, active := 1472.0, 32*(1-math.Pow(1-8.0/256, 1472))
	padded := active * math.Ceil(rows/active/tile) * tile
	c := ms(2 * padded * dsExpert / fp8GemmRate)
	b := ms((active*dsExpert + rows*(dsHidden*3+dsWidth*5)) / weightRate)
	near(t, "moe layer", moe, 2*gemmK+math.Hypot(c, b)+elemK+ms(rows*3*dsWidth*2/elemRate))
	send, recv := 1024*7*hitGPU(256, 32, 8), 1472*7.0/8*hitGPU(256, 32, 8)
	near(t, "a2a layer", a2a, ms(math.Max(send, recv)*(dsDispatchRow+dsCombineRow)/a2aRate)+0.030)
	var lead, layer, tail, worst float64
	for _, c := range ranks {
		lead, layer, tail = math.Max(lead, c.LeadMS), math.Max(layer, c.MoELayerMS), math.Max(tail, c.TailMS)
		worst = math.Max(worst, c.MS())
	}
	// The deep chunk makes rank 0 the slowest at every layer.
	if lead != ranks[0].LeadMS || layer != ranks[0].MoELayerMS {
		t.Errorf("rank 0 (deep chunk) should bound every segment: lead %v vs %v, layer %v vs %v",
			lead, ranks[0].LeadMS, layer, ranks[0].MoELayerMS)
	}
	want := lead + 57*layer + tail + 58*(moe+a2a)
	got := p.FleetStepMS(ranks)
	near(t, "FleetStepMS", got, want)
	if got <= worst {
		t.Errorf("FleetStepMS %.3f must exceed the slowest rank alone %.3f (the experts see the fleet's tokens)", got, worst)
	}
	// A rank's MS is its lockstep segments plus its solo MoE part.
	for _, c := range ranks {
		near(t, "segments", c.LeadMS+57*c.MoELayerMS+c.TailMS+c.MoEMS+c.AllToAllMS, c.MS())
		solo, soloA2A := p.d.moeLayer(float64(c.Tokens), float64(c.Tokens))
		near(t, "solo MoE", c.MoEMS, 58*solo)
		near(t, "solo a2a", c.AllToAllMS, 58*soloA2A)
	}
}

func TestMonotonicity(t *testing.T) {
	for _, pm := range [][2]string{{"h200", "llama-8b"}, {"h100", "llama-70b"}, {"b200", "deepseek-v3"}, {"gb300", "kimi-k2"}} {
		p := builtin(t, pm[0], pm[1], Parallelism{TP: map[string]int{"llama-70b": 4}[pm[1]]})
		prevDec, prevChunk := 0.0, 0.0
		for _, kv := range []int{0, 1, 100, 1000, 4096, 8192, 32768, 131072} {
			dec := p.StepCost([]Work{{NewTokens: 1, KVBefore: kv}}).MS()
			chunk := p.StepCost([]Work{{NewTokens: 512, KVBefore: kv}}).MS()
			if dec <= prevDec || chunk <= prevChunk {
				t.Errorf("%v: kv %d: decode %.4f (prev %.4f), chunk %.4f (prev %.4f): more depth must cost more",
					pm, kv, dec, prevDec, chunk, prevChunk)
			}
			prevDec, prevChunk = dec, chunk
		}
		for _, n := range []int{2, 64, 512, 4096} {
			at0, deep := p.StepCost([]Work{{NewTokens: n, KVBefore: 0}}).MS(), p.StepCost([]Work{{NewTokens: n, KVBefore: 16384}}).MS()
			if deep <= at0 {
				t.Errorf("%v: chunk %d at depth 16384 (%.4f) must cost more than at depth 0 (%.4f)", pm, n, deep, at0)
			}
			more := p.StepCost([]Work{{NewTokens: 2 * n, KVBefore: 0}}).MS()
			if more <= at0 {
				t.Errorf("%v: chunk %d (%.4f) must cost more than chunk %d (%.4f)", pm, 2*n, more, n, at0)
			}
		}
	}
}

// randomStep draws a rank's step: some decodes, maybe context chunks.
func randomStep(rng *rand.Rand) []Work {
	var w []Work
	for range rng.IntN(80) {
		w = append(w, Work{NewTokens: 1, KVBefore: rng.IntN(60000)})
	}
	for range rng.IntN(3) {
		w = append(w, Work{NewTokens: 2 + rng.IntN(4000), KVBefore: rng.IntN(60000)})
	}
	return w
}

func TestLockstepNeverBelowSlowestRank(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	profiles := []*Profile{
		builtin(t, "h200", "llama-8b", Parallelism{}),
		builtin(t, "h100", "llama-70b", Parallelism{TP: 2}),
		builtin(t, "h200", "deepseek-v3", Parallelism{}),
		builtin(t, "b200", "deepseek-v3", Parallelism{TP: 2, EP: 16}),
		builtin(t, "gb300", "kimi-k2", Parallelism{EP: 64}),
	}
	for _, p := range profiles {
		for trial := 0; trial < 50; trial++ {
			ranks := make([]StepCost, 1+rng.IntN(16))
			worst := 0.0
			for r := range ranks {
				ranks[r] = p.StepCost(randomStep(rng))
				worst = math.Max(worst, ranks[r].MS())
			}
			fleet := p.FleetStepMS(ranks)
			if fleet < worst-1e-9 {
				t.Fatalf("%s/%s: FleetStepMS %.6f below the slowest rank %.6f", p.GPU.Name, p.Model.Name, fleet, worst)
			}
			if !p.Model.MoE() && fleet != worst {
				t.Fatalf("%s: dense FleetStepMS %.6f must equal the slowest rank %.6f", p.Model.Name, fleet, worst)
			}
		}
		one := p.StepCost([]Work{{NewTokens: 300, KVBefore: 5000}, {NewTokens: 1, KVBefore: 20}})
		near(t, "fleet of one", p.FleetStepMS([]StepCost{one}), one.MS())
	}
}

func TestEmptyStepCostsNothing(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	if c := p.StepCost(nil); c != (StepCost{}) || c.MS() != 0 {
		t.Errorf("empty step: %+v", c)
	}
	if got := p.FleetStepMS([]StepCost{{}, {}}); got != 0 {
		t.Errorf("fleet of empty steps = %v, want 0", got)
	}
}

func TestStepCostDoesNotAllocate(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	w := randomStep(rand.New(rand.NewPCG(3, 4)))
	ranks := make([]StepCost, 64)
	allocs := testing.AllocsPerRun(100, func() {
		for r := range ranks {
			ranks[r] = p.StepCost(w)
		}
		_ = p.FleetStepMS(ranks)
	})
	if allocs != 0 {
		t.Errorf("StepCost + FleetStepMS allocate %.1f times per run", allocs)
	}
}

func TestStepCostPanicsOnUnvalidatedProfile(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("StepCost on a zero Profile must panic naming the missing Validate")
		}
	}()
	var p Profile
	p.StepCost([]Work{{NewTokens: 1, KVBefore: 0}})
}

// Scored rows (prompt log-probabilities) are LM head rows: a 512-token
// chunk that scores 511 of them costs their LM head (a 512-row GEMM in
// place of one row), nothing else.
func TestScoredRowsCostTheLMHead(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	plain := p.StepCost([]Work{{NewTokens: 512}})
	scored := p.StepCost([]Work{{NewTokens: 512, Scored: 511}})
	if scored.LMHeadMS <= 2*plain.LMHeadMS {
		t.Errorf("LM head %.4f ms scored, %.4f ms plain: 511 scored rows must cost more", scored.LMHeadMS, plain.LMHeadMS)
	}
	if d := scored.MS() - scored.LMHeadMS - (plain.MS() - plain.LMHeadMS); math.Abs(d) > 1e-12 {
		t.Errorf("scoring changed the rest of the step by %.6f ms", d)
	}
}

// A sliding window (Gemma, Mistral 7B v0.1) caps the attention of the
// layers that have it: a decode past the window reads the window only, a
// context chunk's pairs and reads are cut at it; below the window nothing
// changes; a pattern that slides half the layers costs the average of the
// two; the KV a CUDA-graph padded rank is recosted from travels with the
// step cost.
func TestSlidingWindowAttention(t *testing.T) {
	withWindow := func(window, pattern int) *Profile {
		p := builtin(t, "h200", "llama-8b", Parallelism{})
		p.Model.SlidingWindow, p.Model.SlidingWindowPattern = window, pattern
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full, all, half := withWindow(0, 0), withWindow(1024, 0), withWindow(1024, 2)
	if got := half.Model.SlidingLayers(); got != 16 {
		t.Fatalf("pattern 2 over 32 layers slides %d, want 16", got)
	}
	attn := func(p *Profile, w []Work) float64 { return p.StepCost(w).AttentionMS }
	short := []Work{{NewTokens: 1, KVBefore: 500}}
	near(t, "decode inside the window", attn(all, short), attn(full, short))
	deep := []Work{{NewTokens: 1, KVBefore: 8000}}
	near(t, "decode past the window", attn(all, deep), attn(full, []Work{{NewTokens: 1, KVBefore: 1023}}))
	near(t, "half the layers", attn(half, deep), (attn(all, deep)+attn(full, deep))/2)
	if c := all.StepCost(deep); c.DecodeKV != 8001 || c.DecodeKVWindow != 1024 {
		t.Fatalf("decode KV %v, in the window %v; want 8001 and 1024", c.DecodeKV, c.DecodeKVWindow)
	}
	chunk := []Work{{NewTokens: 2048, KVBefore: 4096}}
	if a, f := attn(all, chunk), attn(full, chunk); !(a < f/3) {
		t.Fatalf("a 2048-token chunk at depth 4096: %v ms with a 1024 window, %v without", a, f)
	}
	// The pairs of a chunk against the closed forms.
	for _, tc := range []struct{ kv, n, w, want float64 }{
		{0, 100, 1000, 100 * 50}, // inside: n(kv + n/2)
		{5000, 10, 1000, 10 * 1000},
		{900, 200, 1000, 99*(900+49.5) + 101*1000},
	} {
		approx(t, "window pairs", windowPairs(tc.kv, tc.n, tc.w), tc.want)
	}
	// Gemma 3's form on llama-8b's geometry (a 1024 window on five layers
	// of six): 64 decodes at depth 32k and an 8k chunk at depth 24k.
	gemma3 := withWindow(1024, 6)
	var dec []Work
	for i := 0; i < 64; i++ {
		dec = append(dec, Work{NewTokens: 1, KVBefore: 32768})
	}
	big := []Work{{NewTokens: 8192, KVBefore: 24576}}
	for _, p := range []*Profile{full, gemma3} {
		d, ch := p.StepCost(dec), p.StepCost(big)
		t.Logf("window %d, pattern %d: 64 decodes at 32k: attention %.3f of %.3f ms; an 8k chunk at 24k: attention %.3f of %.3f ms",
			p.Model.SlidingWindow, p.Model.SlidingWindowPattern, d.AttentionMS, d.MS(), ch.AttentionMS, ch.MS())
	}
	// Encoded and decoded whole (the virtual clock's record).
	c := all.StepCost(deep)
	back, err := DecodeStepCost(c.AppendBinary(nil))
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}
