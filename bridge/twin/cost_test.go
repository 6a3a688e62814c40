package twin

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Rates of the built-in h200 profile, written out so that the expected
// values below are computed from the datasheet and the coefficients, not
// from the code under test.
const (
	h200BF16     = 989.5e12         // FLOP/s dense
	h200FP8      = 1979e12          // FLOP/s dense
	h200HBM      = 4.8e12           // B/s
	h200NVDir    = 450e9            // B/s, one direction
	gemmRate     = h200BF16 * 0.70  // 692.65e12 FLOP/s
	fp8GemmRate  = h200FP8 * 0.70   // 1385.3e12 FLOP/s
	weightStream = h200HBM * 0.80   // 3.84e12 B/s
	attnRate     = h200BF16 * 0.65  // 643.175e12 FLOP/s
	kvStream     = h200HBM * 0.75   // 3.6e12 B/s
	elemStream   = h200HBM * 0.80   // 3.84e12 B/s
	commRate     = h200NVDir * 0.75 // 337.5e9 B/s
)

// llama-8b: hidden 4096, 32 heads, 8 KV heads, head dim 128, intermediate
// 14336, vocab 128256, 32 layers.
const (
	// GEMM weights per layer: attention 4096·128·(2·32 + 2·8) = 41,943,040
	// plus MLP 3·4096·14336 = 176,160,768.
	l8LayerParams = 41943040 + 176160768 // 218,103,808
	l8Params      = 32 * l8LayerParams   // 6,979,321,856
	// KV bytes per token and layer: 2·8·128·2.
	l8KVLayer = 4096
	// Element-wise bytes per token and layer: norms 8·4096·2 = 65,536, RoPE
	// on q and k 2·(32+8)·128·2 = 20,480, KV append 4,096, SiLU·mul
	// 3·14336·2 = 86,016.
	l8ElemLayer = 65536 + 20480 + 4096 + 86016 // 176,128
	// Outside the layers: embedding gather 4096·2 + 4096·2, final norm 2·4096·2.
	l8ElemStep = 16384 + 16384
	// LM head weights 128256·4096; logits 2·128256·4 bytes per sequence.
	l8LMParams = 128256 * 4096 // 525,336,576
	l8Logits   = 2 * 128256 * 4
)

func ms(seconds float64) float64 { return seconds * 1e3 }

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

// lmHead8B is the LM head of ns sequences: weight-bound (1.05 GB at
// 3.84 TB/s = 0.2736 ms) plus the logits traffic.
func lmHead8B(ns float64) float64 {
	return math.Max(ms(2*ns*l8LMParams/gemmRate), ms(l8LMParams*2/weightStream)) + ms(ns*l8Logits/elemStream)
}

func TestLlama8BDecodeH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	c := p.StepCost([]Work{{NewTokens: 1, KVBefore: 4096}})
	// GEMMs read every weight once: 6,979,321,856 · 2 B / 3.84e12 B/s = 3.6351 ms
	// (compute 2·1·6.98e9 / 692.65e12 = 0.02 ms is far below).
	near(t, "GEMM", c.GEMMMS, ms(l8Params*2/weightStream))
	// Attention per layer reads 4097 tokens · 4096 B = 16.8 MB at 3.6e12 B/s
	// = 4.66 µs (FLOPs 4·32·128·4096.5 = 67 MFLOP at 643 TFLOP/s = 0.10 µs);
	// 32 layers: 0.14917 ms.
	near(t, "attention", c.AttentionMS, 32*ms(4097*l8KVLayer/kvStream))
	// Element-wise: (32·176,128 + 32,768) B / 3.84e12 B/s = 0.00148 ms.
	near(t, "norm", c.NormMS, ms((32*l8ElemLayer+l8ElemStep)/elemStream))
	// LM head: 0.27361 + 0.00027 ms.
	near(t, "LM head", c.LMHeadMS, lmHead8B(1))
	// A pure decode replays a CUDA graph: 0.1 + 32·0.008 ms.
	near(t, "overhead", c.OverheadMS, 0.1+32*0.008)
	// Total ≈ 3.6351 + 0.1492 + 0.0015 + 0.2739 + 0.356 = 4.4156 ms.
	approx(t, "MS", c.MS(), 4.415587)
}

func TestLlama8BChunkH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	// Compute-bound GEMMs: 2·512·6,979,321,856 FLOP / 692.65e12 = 10.318 ms.
	gemm := ms(2 * 512 * l8Params / gemmRate)
	norm := ms(512 * (32*l8ElemLayer + l8ElemStep) / elemStream) // 0.7558 ms
	ovh := 0.1 + 32*0.02                                         // not a graph
	for _, tc := range []struct {
		kv   int
		attn float64
		want float64
	}{
		// kv 0: 512·(0 + 256) = 131,072 pairs · 4·32·128 FLOP = 2.15 GFLOP per
		// layer at 643.175 TFLOP/s = 3.339 µs (KV read 512·4096 B = 0.58 µs);
		// 32 layers = 0.10684 ms. Total 12.1947 ms.
		{0, 32 * ms(512*256*16384/attnRate), 12.19466},
		// kv 8192: 512·(8192 + 256) = 4,325,376 pairs = 70.9 GFLOP per layer =
		// 0.11018 ms; 32 layers = 3.5259 ms. Total 15.6137 ms.
		{8192, 32 * ms(512*8448*16384/attnRate), 15.61368},
	} {
		c := p.StepCost([]Work{{NewTokens: 512, KVBefore: tc.kv}})
		near(t, "GEMM", c.GEMMMS, gemm)
		near(t, "attention", c.AttentionMS, tc.attn)
		near(t, "norm", c.NormMS, norm)
		near(t, "LM head", c.LMHeadMS, lmHead8B(1))
		near(t, "overhead", c.OverheadMS, ovh)
		approx(t, "MS", c.MS(), tc.want)
	}
}

func TestLlama8BMixedBatchH200(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	// Two decodes (kv 4096 and 1000) and a 512-token chunk at kv 2048:
	// 514 tokens, 3 sequences.
	c := p.StepCost([]Work{{1, 4096}, {1, 1000}, {512, 2048}})
	// Context kernel per layer: 512·(2048+256) = 1,179,648 pairs · 16384 FLOP
	// = 19.3 GFLOP at 643.175 TFLOP/s = 30.05 µs (KV read 2560·4096 B =
	// 2.9 µs). Decode kernel: reads (4097 + 1001)·4096 B at 3.6e12 = 5.80 µs
	// (FLOPs (4096.5 + 1000.5)·16384 = 0.13 µs). Per layer 35.85 µs, 32
	// layers 1.1472 ms.
	attn := 32 * (ms(512*2304*16384/attnRate) + ms((4097+1001)*l8KVLayer/kvStream))
	near(t, "attention", c.AttentionMS, attn)
	near(t, "GEMM", c.GEMMMS, ms(2*514*l8Params/gemmRate))
	near(t, "norm", c.NormMS, ms(514*(32*l8ElemLayer+l8ElemStep)/elemStream))
	near(t, "LM head", c.LMHeadMS, lmHead8B(3))
	near(t, "overhead", c.OverheadMS, 0.74)
	if c.Tokens != 514 || c.Seqs != 3 {
		t.Errorf("tokens, seqs = %d, %d; want 514, 3", c.Tokens, c.Seqs)
	}
	approx(t, "MS", c.MS(), 13.27882)
}

// DeepSeek-V3 on h200, EP 8: routed expert = 3·7168·2048 = 44,040,192
// weights (FP8, 1 B each); 32 experts per GPU; 58 MoE layers.
const (
	dsExpert     = 3 * 7168 * 2048
	dsA2ARowByte = 7168 * 2 * 7 / 8 // one hidden row (BF16) of which 7/8 leaves the GPU
)

// dsMoELayer is the fleet-coupled part of one MoE layer written out.
func dsMoELayer(fleet, maxRank float64) (moe, a2a float64) {
	rows := fleet * 8 / 8 // expert rows per GPU: fleet·top_k / EP
	active := 32 * (1 - math.Pow(1-8.0/256, fleet))
	moe = math.Max(ms(2*rows*dsExpert/fp8GemmRate), ms(active*dsExpert*1/weightStream)) +
		ms(rows*3*2048*2/elemStream) // SiLU·mul of the routed rows
	a2a = 2 * (ms(math.Max(maxRank*8, rows)*dsA2ARowByte/commRate) + 0.015)
	return moe, a2a
}

func TestDeepSeekFleetLockstep(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	// Rank 0 prefills a 1024-token chunk at depth 16384; ranks 1-7 each
	// decode 64 sequences at depth 4096. Fleet: 1024 + 7·64 = 1472 tokens.
	ranks := make([]StepCost, 8)
	ranks[0] = p.StepCost([]Work{{1024, 16384}})
	decodes := make([]Work, 64)
	for i := range decodes {
		decodes[i] = Work{1, 4096}
	}
	for r := 1; r < 8; r++ {
		ranks[r] = p.StepCost(decodes)
	}
	// MoE per layer for 1472 tokens: 1472 rows per GPU; every one of the 32
	// experts is hit (1 − (31/32)^1472 ≈ 1), so the 32·44 MB of weights at
	// 3.84e12 B/s = 0.3670 ms bound it (FLOPs 2·1472·44e6 at 1385 TFLOP/s =
	// 0.094 ms), plus 0.0047 ms of SiLU·mul. All-to-all: rank 0 sends
	// 1024·8 rows · 12,544 B = 102.8 MB at 337.5 GB/s = 0.3045 ms + 15 µs,
	// twice (dispatch and combine).
	moe, a2a := dsMoELayer(1472, 1024)
	approx(t, "moe layer", moe, 0.3717120)
	approx(t, "a2a layer", a2a, 0.6389508)
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
	for r, c := range ranks {
		near(t, "segments", c.LeadMS+57*c.MoELayerMS+c.TailMS+c.MoEMS+c.AllToAllMS, c.MS())
		solo, soloA2A := dsMoELayer(float64(c.Tokens), float64(c.Tokens))
		near(t, "solo MoE", c.MoEMS, 58*solo)
		near(t, "solo a2a", c.AllToAllMS, 58*soloA2A)
		_ = r
	}
}

func TestMonotonicity(t *testing.T) {
	for _, pm := range [][2]string{{"h200", "llama-8b"}, {"h100", "llama-70b"}, {"b200", "deepseek-v3"}, {"gb300", "kimi-k2"}} {
		p := builtin(t, pm[0], pm[1], Parallelism{TP: map[string]int{"llama-70b": 4}[pm[1]]})
		prevDec, prevChunk := 0.0, 0.0
		for _, kv := range []int{0, 1, 100, 1000, 4096, 8192, 32768, 131072} {
			dec := p.StepCost([]Work{{1, kv}}).MS()
			chunk := p.StepCost([]Work{{512, kv}}).MS()
			if dec <= prevDec || chunk <= prevChunk {
				t.Errorf("%v: kv %d: decode %.4f (prev %.4f), chunk %.4f (prev %.4f): more depth must cost more",
					pm, kv, dec, prevDec, chunk, prevChunk)
			}
			prevDec, prevChunk = dec, chunk
		}
		for _, n := range []int{2, 64, 512, 4096} {
			at0, deep := p.StepCost([]Work{{n, 0}}).MS(), p.StepCost([]Work{{n, 16384}}).MS()
			if deep <= at0 {
				t.Errorf("%v: chunk %d at depth 16384 (%.4f) must cost more than at depth 0 (%.4f)", pm, n, deep, at0)
			}
			more := p.StepCost([]Work{{2 * n, 0}}).MS()
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
		w = append(w, Work{1, rng.IntN(60000)})
	}
	for range rng.IntN(3) {
		w = append(w, Work{2 + rng.IntN(4000), rng.IntN(60000)})
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
		one := p.StepCost([]Work{{300, 5000}, {1, 20}})
		near(t, "fleet of one", p.FleetStepMS([]StepCost{one}), one.MS())
	}
}

func TestTensorParallelSplitsWorkAndAddsAllReduce(t *testing.T) {
	p1 := builtin(t, "h200", "llama-70b", Parallelism{TP: 1})
	p2 := builtin(t, "h200", "llama-70b", Parallelism{TP: 2})
	w := []Work{{2048, 0}}
	c1, c2 := p1.StepCost(w), p2.StepCost(w)
	near(t, "GEMM halves", c2.GEMMMS, c1.GEMMMS/2)
	near(t, "attention halves", c2.AttentionMS, c1.AttentionMS/2)
	if c1.CommMS != 0 {
		t.Errorf("tp 1 has no all-reduce, got %v ms", c1.CommMS)
	}
	// Two ring all-reduces per layer of 2048 rows of 8192·2 B:
	// 2·(2−1)/2 · 33.5 MB / 337.5 GB/s + 15 µs = 0.1144 ms each; 160 of them.
	near(t, "all-reduce", c2.CommMS, 160*(ms(1*2048*8192*2/commRate)+0.015))
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
	p.StepCost([]Work{{1, 0}})
}
