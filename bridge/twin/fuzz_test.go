package twin

import (
	"bytes"
	"math"
	"testing"
	"time"
)

// FuzzReadProfile: a cost profile file (--cost-profile) is either refused
// with an error or, once it validates, costs every step finitely: no
// panic, no NaN, infinite or negative time, in one rank's step or in a
// fleet's, with or without the attention-DP coupling, and its KV pool is a
// page count or an error. The seeds are the built-in profiles as
// `worker twin-profile` prints them, and a linear one.
func FuzzReadProfile(f *testing.F) {
	for _, c := range []struct{ gpu, model string }{{"h200", "llama-8b"}, {"h100", "llama-70b"}, {"b200", "deepseek-v3"},
		{"h200", "qwen3-30b-a3b"}} {
		p, err := BuiltinProfile(c.gpu, c.model, Parallelism{TP: 1})
		if err != nil {
			f.Fatal(err)
		}
		var b bytes.Buffer
		if err := p.WriteJSON(&b); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes(), uint8(3), uint16(100))
	}
	f.Add([]byte(`{"version":2,"kind":"linear"}`), uint8(1), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, seqs uint8, kv uint16) {
		start := time.Now()
		defer func() {
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("took %v:\n%s", d, data)
			}
		}()
		p, err := ReadProfile(bytes.NewReader(data))
		if err != nil {
			return
		}
		works := make([]Work, 0, int(seqs)%64+1)
		for i := range cap(works) {
			works = append(works, Work{NewTokens: 1 + (i*37)%(1+int(kv)%512), KVBefore: int(kv) * i % 70000})
		}
		finite := func(what string, v float64) {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("%s = %g for a profile that validated:\n%s", what, v, data)
			}
		}
		c := p.StepCost(works)
		finite("StepCost.MS", c.MS())
		finite("FleetStepMS", p.FleetStepMS([]StepCost{c, p.StepCost(works[:1]), {}}))
		if pages, err := p.PoolPages(16); err == nil && pages < 0 {
			t.Fatalf("PoolPages = %d", pages)
		}
		if q, err := p.WithRanks(4); err == nil {
			finite("WithRanks(4).StepCost.MS", q.StepCost(works).MS())
			if a, err := q.WithAttentionDP(AttentionDP{CUDAGraph: GraphFleet, MoEPadding: q.Model.MoELayers() > 0}); err == nil {
				finite("fleet FleetStepMS", a.FleetStepMS([]StepCost{a.StepCost(works), a.StepCost(works[:1]), {}, {}}))
			}
		}
	})
}

// FuzzMeasurements: a measured.json (`worker twin-profile --measured`, what
// scripts/device-check.sh writes) is refused with an error, or re-bases a
// built-in profile into one that validates and costs steps finitely.
func FuzzMeasurements(f *testing.F) {
	f.Add([]byte(`{"version":1,"gpu":"h200","source":"s","gemm_tflops":690,"prefill_attention_tflops":560,`+
		`"decode_attention_gbps":3900,"step_overhead_ms":0.12,"gemm_weight_gbps":4100,"elementwise_gbps":4000,`+
		`"layer_overhead_ms":0.02,"graph_layer_overhead_ms":0.008,"fp8_gemm_tflops":1350,"gemm_kernel_ms":0.005,`+
		`"attention_kernel_ms":0.012,"elementwise_kernel_ms":0.003}`), uint8(0))
	f.Add([]byte(`{"version":1,"gpu":"h100","source":"s","gemm_tflops":1e-300,"prefill_attention_tflops":1e-300,`+
		`"decode_attention_gbps":1e-300,"step_overhead_ms":1e300}`), uint8(1))
	bases := []struct{ gpu, model string }{{"h200", "llama-8b"}, {"h100", "deepseek-v3"}, {"b200", "llama-70b"}}
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		m, err := ReadMeasurements(data)
		if err != nil {
			return
		}
		b := bases[int(which)%len(bases)]
		base, err := BuiltinProfile(b.gpu, b.model, Parallelism{TP: 1})
		if err != nil {
			t.Fatal(err)
		}
		p, err := ProfileFromMeasurements(base, m)
		if err != nil {
			return
		}
		if err := p.Validate(); err != nil {
			return // refused when used, with the field named
		}
		works := []Work{{NewTokens: 512, KVBefore: 0}, {NewTokens: 1, KVBefore: 4096}}
		if v := p.StepCost(works).MS(); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("StepCost.MS = %g for measurements %s", v, data)
		}
	})
}
