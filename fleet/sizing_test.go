package fleet

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestWeightBytes: the CUDA engine's weights as --pages 0 subtracts them,
// against the parameter counts bridge/twin/memory_test.go derives
// independently (twin.Profile.WeightBytesPerGPU), at 2 bytes each.
func TestWeightBytes(t *testing.T) {
	for _, c := range []struct {
		model string
		ep    int
		want  uint64
	}{
		// 8,030,261,248 parameters.
		{"llama-8b", 1, 16060522496},
		// Attention 61·187,105,280 + dense MLP 3·396,361,728 + 58·(shared
		// 44,040,192 + router 1,835,008 + 32 experts·44,040,192) +
		// embedding, LM head and norms 1,853,358,080 + 1,006,592 =
		// 98,856,229,888 parameters on each of 8 EP ranks.
		{"deepseek-v3", 8, 197712459776},
		// One rank holds all 256 experts: 58·224·44,040,192 more.
		{"deepseek-v3", 1, 197712459776 + 2*58*224*44040192},
	} {
		s, ok := bridge.Presets[c.model]
		if !ok {
			t.Fatalf("no preset %s", c.model)
		}
		if got := weightBytes(s, c.ep); got != c.want {
			t.Errorf("weightBytes(%s, ep %d) = %d, want %d", c.model, c.ep, got, c.want)
		}
	}
}

// TestMaxModelLen: the context /v1/models reports is --max-seq-len when it
// is below the pool's (global) tokens, else the pool's size; a Helix group
// of CP ranks holds CP times one rank's pages.
func TestMaxModelLen(t *testing.T) {
	for _, c := range []struct{ pages, tpp, cp, maxSeqLen, want int }{
		{64, 16, 1, 0, 1024},
		{64, 16, 2, 0, 2048},
		{64, 16, 2, 256, 256},
		{64, 16, 1, 4096, 1024},
		{64, 16, 1, 1024, 1024},
	} {
		o := Options{Pages: c.pages, TokensPerPage: c.tpp, CP: c.cp, MaxSeqLen: c.maxSeqLen}
		if got := o.MaxModelLen(); got != c.want {
			t.Errorf("%+v: MaxModelLen = %d, want %d", c, got, c.want)
		}
	}
}
