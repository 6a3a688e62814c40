package twin

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// withADP is p with the attention-DP coupling a.
func withADP(t *testing.T, p *Profile, a AttentionDP) *Profile {
	t.Helper()
	q, err := p.WithAttentionDP(a)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// decodes is n decodes at KV depth kv, then pad dummy decodes at depth 0.
func decodes(n, kv, pad int) []Work {
	w := make([]Work, 0, n+pad)
	for range n {
		w = append(w, Work{NewTokens: 1, KVBefore: kv})
	}
	for range pad {
		w = append(w, Work{NewTokens: 1, KVBefore: 0})
	}
	return w
}

// TestGraphSizes: TensorRT-LLM's captured sizes with padding on.
func TestGraphSizes(t *testing.T) {
	eight := []int{8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128}
	for _, c := range []struct {
		max  int
		want []int
	}{
		{128, append([]int{1, 2, 4}, eight...)},
		{512, append(append([]int{1, 2, 4}, eight...), 256, 512)},
		{300, append(append([]int{1, 2, 4}, eight...), 256, 300)},
		{1024, append(append([]int{1, 2, 4}, eight...), 256, 512, 1024)},
		{20, []int{1, 2, 4, 8, 16, 20}},
		{3, []int{1, 2, 3}},
		{1, []int{1}},
	} {
		if got := graphSizes(c.max); !slices.Equal(got, c.want) {
			t.Errorf("graphSizes(%d) = %v, want %v", c.max, got, c.want)
		}
	}
	p := withADP(t, builtin(t, "h200", "llama-8b", Parallelism{}), AttentionDP{CUDAGraph: GraphFleet})
	for n, want := range map[int]int{1: 1, 3: 4, 5: 8, 9: 16, 100: 104, 128: 128, 129: 0, 1000: 0} {
		if got := p.d.graphBatch(n); got != want {
			t.Errorf("graphBatch(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestFleetGraphPadsToTheLargestRank: a generation-only fleet replays
// graphs at the captured size above its largest batch; every rank costs
// what that padded batch costs.
func TestFleetGraphPadsToTheLargestRank(t *testing.T) {
	base := builtin(t, "h200", "llama-8b", Parallelism{})
	p := withADP(t, base, AttentionDP{CUDAGraph: GraphFleet})
	ranks := []StepCost{p.StepCost(decodes(10, 2000, 0)), p.StepCost(decodes(30, 500, 0)), p.StepCost(decodes(3, 9000, 0))}
	// The largest batch is 30: every rank pads to 32 with dummies at depth 0.
	want := max(p.StepCost(decodes(10, 2000, 22)).MS(), p.StepCost(decodes(30, 500, 2)).MS(), p.StepCost(decodes(3, 9000, 29)).MS())
	near(t, "padded fleet", p.FleetStepMS(ranks), want)
	// Off, the same ranks cost their own batches.
	near(t, "rank graphs", base.FleetStepMS(ranks), max(ranks[0].MS(), ranks[1].MS(), ranks[2].MS()))
	if p.FleetStepMS(ranks) <= base.FleetStepMS(ranks) {
		t.Errorf("padding must cost something: %.4f vs %.4f ms", p.FleetStepMS(ranks), base.FleetStepMS(ranks))
	}
	// Equal batches at a captured size: nothing changes.
	eq := []StepCost{p.StepCost(decodes(32, 100, 0)), p.StepCost(decodes(32, 7000, 0))}
	near(t, "captured size", p.FleetStepMS(eq), base.FleetStepMS(eq))
}

// TestFleetGraphOneContextMakesEveryRankEager: one rank's context chunk
// takes every rank off its graph (TensorRT-LLM's is_all_gen_only); so does
// a batch above the largest captured size.
func TestFleetGraphOneContextMakesEveryRankEager(t *testing.T) {
	base := builtin(t, "h200", "llama-8b", Parallelism{})
	p := withADP(t, base, AttentionDP{CUDAGraph: GraphFleet})
	dec := p.StepCost(decodes(64, 3000, 0))
	ctx := p.StepCost([]Work{{NewTokens: 16, KVBefore: 0}})
	eager := p.fleetRank(&dec, 0)
	// 32 layers, each its launch gap without a graph.
	gap := 32 * (p.Roofline.LayerOverheadMS.Value - p.Roofline.GraphLayerOverheadMS.Value)
	near(t, "eager decode", eager.MS(), dec.MS()+gap)
	if ctx.MS() >= eager.MS() {
		t.Fatalf("the test needs a short chunk: chunk %.4f ms, eager decode %.4f ms", ctx.MS(), eager.MS())
	}
	near(t, "mixed fleet", p.FleetStepMS([]StepCost{dec, ctx}), eager.MS())
	near(t, "mixed fleet, rank graphs", base.FleetStepMS([]StepCost{dec, ctx}), dec.MS())
	// A context rank is unchanged.
	if got := p.fleetRank(&ctx, 0); got != ctx {
		t.Errorf("a context rank changed: %+v vs %+v", got, ctx)
	}
	// 200 decodes are above the 128 captured by default: eager.
	big := p.StepCost(decodes(200, 100, 0))
	near(t, "over the largest graph", p.FleetStepMS([]StepCost{big, dec}), max(p.fleetRank(&big, 0).MS(), eager.MS()))
	// With 256 captured, the fleet pads to 256.
	q := withADP(t, base, AttentionDP{CUDAGraph: GraphFleet, CUDAGraphMaxBatchSize: 256})
	near(t, "graph max 256", q.FleetStepMS([]StepCost{big, dec}),
		max(q.StepCost(decodes(200, 100, 56)).MS(), q.StepCost(decodes(64, 3000, 192)).MS()))
}

// TestMoEPaddingExpertsSeeRanksTimesMax: with MoE padding the experts and
// the all-to-all carry every rank padded to the largest rank's tokens.
func TestMoEPaddingExpertsSeeRanksTimesMax(t *testing.T) {
	base, err := builtin(t, "b200", "deepseek-v3", Parallelism{}).WithRanks(8)
	if err != nil {
		t.Fatal(err)
	}
	p := withADP(t, base, AttentionDP{MoEPadding: true})
	ranks := make([]StepCost, 8)
	ranks[0] = p.StepCost([]Work{{NewTokens: 2048, KVBefore: 0}})
	for r := 1; r < 8; r++ {
		ranks[r] = p.StepCost(decodes(32, 1000, 0))
	}
	var lead, layer, tail float64
	for _, c := range ranks {
		lead, layer, tail = max(lead, c.LeadMS), max(layer, c.MoELayerMS), max(tail, c.TailMS)
	}
	moe, a2a := p.d.moeLayer(8*2048, 2048)
	near(t, "padded MoE", p.FleetStepMS(ranks), lead+57*layer+tail+58*(moe+a2a))
	moeOff, a2aOff := p.d.moeLayer(2048+7*32, 2048)
	near(t, "unpadded MoE", base.FleetStepMS(ranks), lead+57*layer+tail+58*(moeOff+a2aOff))
	// Balanced ranks pay nothing for it.
	even := make([]StepCost, 8)
	for r := range even {
		even[r] = p.StepCost(decodes(32, 1000, 0))
	}
	near(t, "balanced", p.FleetStepMS(even), base.FleetStepMS(even))
}

// TestAttentionDPNeverCheaper: random fleets cost at least as much with
// either mechanism on as with both off, and never less than the slowest
// rank; FleetStepMS still does not allocate.
func TestAttentionDPNeverCheaper(t *testing.T) {
	base, err := builtin(t, "h200", "deepseek-v3", Parallelism{}).WithRanks(8)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, a := range []AttentionDP{{CUDAGraph: GraphFleet}, {MoEPadding: true}, {CUDAGraph: GraphFleet, MoEPadding: true, CUDAGraphMaxBatchSize: 512}} {
		p := withADP(t, base, a)
		for range 200 {
			ranks := make([]StepCost, 8)
			for r := range ranks {
				if rng.IntN(3) == 0 {
					ranks[r] = p.StepCost(randomStep(rng))
				} else {
					ranks[r] = p.StepCost(decodes(1+rng.IntN(200), rng.IntN(20000), 0))
				}
			}
			on, off := p.FleetStepMS(ranks), base.FleetStepMS(ranks)
			if on < off*(1-1e-12) {
				t.Fatalf("%+v: %.6f ms below %.6f ms with it off", a, on, off)
			}
		}
		ranks := []StepCost{p.StepCost(decodes(5, 100, 0)), p.StepCost(decodes(50, 100, 0))}
		if n := testing.AllocsPerRun(50, func() { _ = p.FleetStepMS(ranks) }); n != 0 {
			t.Errorf("%+v: FleetStepMS allocates %.1f times", a, n)
		}
	}
}

func TestAttentionDPRefused(t *testing.T) {
	llama := builtin(t, "h200", "llama-8b", Parallelism{})
	for _, c := range []struct {
		a    AttentionDP
		want string
	}{
		{AttentionDP{CUDAGraph: "always"}, `attention_dp.cuda_graph must be "rank" or "fleet", got "always"`},
		{AttentionDP{CUDAGraph: GraphFleet, CUDAGraphMaxBatchSize: -1}, "attention_dp.cuda_graph_max_batch_size must be in [0, 65536]"},
		{AttentionDP{CUDAGraphMaxBatchSize: 64}, `attention_dp.cuda_graph_max_batch_size 64 needs attention_dp.cuda_graph "fleet"`},
		{AttentionDP{MoEPadding: true}, "attention_dp.moe_dp_padding: model llama-8b has no routed experts"},
	} {
		_, err := llama.WithAttentionDP(c.a)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.a, err, c.want)
		}
	}
}

func TestStepCostCarriesDecodeKV(t *testing.T) {
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	c := p.StepCost(append(decodes(3, 10, 0), Work{NewTokens: 100, KVBefore: 50}))
	if c.DecodeKV != 33 {
		t.Errorf("DecodeKV = %v, want 33 (three decodes at depth 10, each reading itself too)", c.DecodeKV)
	}
	got, err := DecodeStepCost(c.AppendBinary(nil))
	if err != nil || got != c {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, c)
	}
}
