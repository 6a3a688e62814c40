package twin

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// syntheticSamples draws n steps of decodes and context chunks, times them
// with truth and multiplies each time by 1 ± noise (uniform).
func syntheticSamples(rng *rand.Rand, n int, truth LinearCoefficients, noise float64, decodeOnly bool) []LinearSample {
	out := make([]LinearSample, 0, n)
	for range n {
		// Each step has its own depth scale, so that the decodes' summed
		// depth is not tied to their count (the two must be told apart).
		var w []Work
		depth := 1 + rng.IntN(32000)
		for range rng.IntN(64) + 1 {
			w = append(w, Work{NewTokens: 1, KVBefore: rng.IntN(depth)})
		}
		if !decodeOnly {
			for range rng.IntN(4) {
				w = append(w, Work{NewTokens: 2 + rng.IntN(2000), KVBefore: rng.IntN(16000)})
			}
		}
		s := FeaturesOf(w)
		s.MS = truth.Predict(s) * (1 + noise*(2*rng.Float64()-1))
		out = append(out, s)
	}
	return out
}

func TestFitLinearRecoversCoefficients(t *testing.T) {
	truth := LinearCoefficients{OverheadMS: 0.8, TokenMS: 0.004, CtxAttentionMS: 2e-7, DecodeKVMS: 3e-6, SeqMS: 0.02}
	rng := rand.New(rand.NewPCG(10, 20))
	got, err := FitLinear(syntheticSamples(rng, 1000, truth, 0.02, false))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"overhead_ms", got.OverheadMS, truth.OverheadMS}, {"token_ms", got.TokenMS, truth.TokenMS},
		{"ctx_attention_ms", got.CtxAttentionMS, truth.CtxAttentionMS}, {"decode_kv_ms", got.DecodeKVMS, truth.DecodeKVMS},
		{"seq_ms", got.SeqMS, truth.SeqMS},
	} {
		if math.Abs(c.got-c.want) > 0.05*c.want {
			t.Errorf("%s = %.4g, want %.4g within 5%%", c.name, c.got, c.want)
		}
	}
}

func TestFitLinearStaysNonNegative(t *testing.T) {
	// A true per-sequence saving (negative seq_ms) cannot be represented:
	// the fit clamps it to 0 and absorbs the rest in the other terms.
	truth := LinearCoefficients{OverheadMS: 2, TokenMS: 0.01, CtxAttentionMS: 1e-7, DecodeKVMS: 1e-6, SeqMS: -0.005}
	rng := rand.New(rand.NewPCG(5, 6))
	got, err := FitLinear(syntheticSamples(rng, 200, truth, 0, false))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{got.OverheadMS, got.TokenMS, got.CtxAttentionMS, got.DecodeKVMS, got.SeqMS} {
		if v < 0 {
			t.Fatalf("negative coefficient in %+v", got)
		}
	}
	if got.SeqMS != 0 {
		t.Errorf("seq_ms = %g, want it clamped to 0", got.SeqMS)
	}
}

func TestFitLinearDecodeOnlyLog(t *testing.T) {
	// No context chunks: ctx_attention_ms has no data and stays 0; tokens
	// and sequences coincide, so only their sum is identified.
	truth := LinearCoefficients{OverheadMS: 0.3, TokenMS: 0.01, DecodeKVMS: 5e-6, SeqMS: 0.002}
	rng := rand.New(rand.NewPCG(7, 8))
	samples := syntheticSamples(rng, 100, truth, 0.01, true)
	got, err := FitLinear(samples)
	if err != nil {
		t.Fatal(err)
	}
	if got.CtxAttentionMS != 0 {
		t.Errorf("ctx_attention_ms = %g without context chunks, want 0", got.CtxAttentionMS)
	}
	if sum := got.TokenMS + got.SeqMS; math.Abs(sum-0.012) > 0.05*0.012 {
		t.Errorf("token_ms + seq_ms = %g, want 0.012 within 5%%", sum)
	}
	var worst float64
	for _, s := range samples {
		worst = math.Max(worst, math.Abs(got.Predict(s)-s.MS)/s.MS)
	}
	if worst > 0.03 {
		t.Errorf("worst relative error %.3f on 1%%-noise data", worst)
	}
}

func TestFitLinearErrors(t *testing.T) {
	if _, err := FitLinear([]LinearSample{{Tokens: 1, MS: 1}}); err == nil || !strings.Contains(err.Error(), "at least 2 samples") {
		t.Errorf("one sample: %v", err)
	}
	bad := []LinearSample{{Tokens: 1, MS: 1}, {Tokens: 2, MS: math.NaN()}}
	if _, err := FitLinear(bad); err == nil || !strings.Contains(err.Error(), "sample 1") {
		t.Errorf("NaN sample: %v", err)
	}
}

func TestLinearProfileStepCost(t *testing.T) {
	c := LinearCoefficients{OverheadMS: 0.5, TokenMS: 0.01, CtxAttentionMS: 1e-6, DecodeKVMS: 2e-5, SeqMS: 0.003}
	p, err := NewLinearProfile(ModelFromShape("tiny", bridge.Presets["tiny"]), c, "test")
	if err != nil {
		t.Fatal(err)
	}
	w := []Work{{NewTokens: 1, KVBefore: 99}, {NewTokens: 1, KVBefore: 9}, {NewTokens: 40, KVBefore: 60}}
	// 0.5 + 0.01·42 + 1e-6·40·(60+20) + 2e-5·(100+10) + 0.003·3 = 0.9332 ms.
	got := p.StepCost(w)
	near(t, "linear MS", got.MS(), 0.5+0.01*42+1e-6*40*80+2e-5*110+0.003*3)
	near(t, "Predict", c.Predict(FeaturesOf(w)), got.MS())
	near(t, "linear fleet", p.FleetStepMS([]StepCost{got, p.StepCost(w[:1])}), got.MS())
	if _, err := NewLinearProfile(ModelFromShape("tiny", bridge.Presets["tiny"]), LinearCoefficients{TokenMS: -1}, "x"); err == nil ||
		!strings.Contains(err.Error(), "linear.token_ms.value must not be negative") {
		t.Errorf("negative term: %v", err)
	}
}
