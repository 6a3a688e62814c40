package twin

import (
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

func TestPoolPages(t *testing.T) {
	for _, tc := range []struct {
		gpu, model string
		par        Parallelism
		weights    float64 // bytes per GPU
		kvPerToken float64 // bytes per GPU
		pages      int
	}{
		// llama-8b bf16: 8,030,261,248 parameters (fleet's weightBytes
		// formula) = 16,060,522,496 B. H200 total 143,771 MiB =
		// 150,754,820,096 B. Pool = (150.75e9 − 16.06e9 − 2e9)·0.9 =
		// 119,424,867,840 B; page = 32 tokens · 131,072 B (2·32·8·128·2)
		// = 4,194,304 B → 28,473 pages.
		{"h200", "llama-8b", Parallelism{}, 16060522496, 131072, 28473},
		// llama-70b, tp 2: linear 68,451,041,280 / 2 + embedding and LM head
		// 2,101,346,304 / 2 + norms 1,318,912 = 35,277,512,704 params =
		// 70,555,025,408 B per GPU; KV 2·80·4·128·2 = 163,840 B per token per
		// GPU. Pool (150.75e9 − 70.555e9 − 2e9)·0.9 = 70,379,815,219.2 B;
		// page 5,242,880 B → 13,423 pages.
		{"h200", "llama-70b", Parallelism{TP: 2}, 70555025408, 163840, 13423},
		// deepseek-v3 fp8, ep 8: attention 61·187,105,280 + dense MLP
		// 3·396,361,728 + 58·(shared 44,040,192 + router 1,835,008 + 32
		// experts·44,040,192) = 97,001,865,216 B; embedding, LM head and norms
		// (1,853,358,080 + 1,006,592)·2 = 3,708,729,344 B; total
		// 100,710,594,560 B. KV latent 61·576·2 = 70,272 B per token. Pool
		// (150.75e9 − 100.71e9 − 2e9)·0.9 = 43,239,802,982.4 B; page
		// 2,248,704 B → 19,228 pages.
		{"h200", "deepseek-v3", Parallelism{EP: 8}, 100710594560, 70272, 19228},
	} {
		p := builtin(t, tc.gpu, tc.model, tc.par)
		near(t, tc.model+" weights", p.WeightBytesPerGPU(), tc.weights)
		near(t, tc.model+" KV per token", p.KVBytesPerToken(), tc.kvPerToken)
		got, err := p.PoolPages(32)
		if err != nil || got != tc.pages {
			t.Errorf("%s/%s %+v: PoolPages(32) = %d, %v; want %d", tc.gpu, tc.model, tc.par, got, err, tc.pages)
		}
	}
}

func TestWeightBytesMatchCUDAEngineSizing(t *testing.T) {
	// cmd/worker sizes the CUDA engine with 2·(2·V·h + L·perLayer + h),
	// perLayer = h·(q + 2kv) + q·h + 3·h·f + 2h: the twin must agree.
	for _, name := range []string{"llama-8b", "llama-70b"} {
		s := bridge.Presets[name]
		h, f, v := float64(s.HiddenSize), float64(s.IntermediateSize), float64(s.VocabSize)
		q, kv := float64(s.NumHeads*s.HeadDim), float64(s.NumKVHeads*s.HeadDim)
		want := 2 * (2*v*h + float64(s.NumLayers)*(h*(q+2*kv)+q*h+3*h*f+2*h) + h)
		near(t, name, builtin(t, "h200", name, Parallelism{}).WeightBytesPerGPU(), want)
	}
}

func TestPoolPagesRefusesWhatDoesNotFit(t *testing.T) {
	for _, tc := range []struct {
		gpu, model string
		par        Parallelism
		want       []string
	}{
		{"h100", "llama-70b", Parallelism{}, []string{
			"llama-70b (bf16 weights) needs 141.1 GB of weights per GPU with tp 1",
			"h100 has 85.5 GB, minus a 2.0 GB reserve",
			"use --tp 2 (70.6 GB of weights per GPU)",
		}},
		{"h100", "kimi-k2", Parallelism{EP: 8}, []string{
			"kimi-k2 (fp8 weights) needs 140.9 GB of weights per GPU with tp 1 and ep 8",
			"spread the experts over more GPUs (ep 16",
		}},
		{"h100", "deepseek-v3", Parallelism{EP: 8}, []string{"needs 100.7 GB", "h100 has 85.5 GB", "(ep 16"}},
	} {
		p := builtin(t, tc.gpu, tc.model, tc.par)
		_, err := p.PoolPages(32)
		if err == nil {
			t.Errorf("%s on %s must be refused", tc.model, tc.gpu)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s on %s: %q lacks %q", tc.model, tc.gpu, err, w)
			}
		}
	}
	p := builtin(t, "h200", "llama-8b", Parallelism{})
	if _, err := p.PoolPages(0); err == nil {
		t.Error("PoolPages(0) must fail")
	}
	lin, _ := NewLinearProfile(ModelFromShape("tiny", bridge.Presets["tiny"]), LinearCoefficients{OverheadMS: 1}, "test")
	if _, err := lin.PoolPages(16); err == nil || !strings.Contains(err.Error(), "give --pages") {
		t.Errorf("linear profile: %v", err)
	}
}
