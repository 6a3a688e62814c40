package twin

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

func TestBuiltinProfilesValidate(t *testing.T) {
	for _, g := range GPUNames() {
		for _, m := range ModelNames() {
			if _, err := BuiltinProfile(g, m, Parallelism{}); err != nil {
				t.Errorf("%s/%s: %v", g, m, err)
			}
		}
	}
	if got, want := strings.Join(GPUNames(), ","), "b200,gb300,h100,h200"; got != want {
		t.Errorf("GPUNames = %s, want %s", got, want)
	}
	for _, tc := range []struct{ gpu, model, want string }{
		{"a100", "llama-8b", `unknown GPU "a100" (allowed: b200, gb300, h100, h200)`},
		{"h200", "llama-405b", `unknown model "llama-405b" (allowed: deepseek-tiny, deepseek-v3, gemma-tiny, kimi-k2, llama-2-70b, llama-2-7b, llama-70b, llama-8b, mixtral-8x7b, moe-tiny, qwen3-30b-a3b, tiny)`},
	} {
		_, err := BuiltinProfile(tc.gpu, tc.model, Parallelism{})
		if err == nil || err.Error() != tc.want {
			t.Errorf("BuiltinProfile(%s, %s) = %v, want %q", tc.gpu, tc.model, err, tc.want)
		}
	}
}

func TestModelsMatchBridgePresets(t *testing.T) {
	for _, name := range bridge.PresetNames() {
		m, err := BuiltinModel(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Shape(); !got.Equal(bridge.Presets[name]) {
			t.Errorf("%s: Shape() = %+v, want the bridge preset %+v", name, got, bridge.Presets[name])
		}
	}
	for _, name := range []string{"deepseek-v3", "kimi-k2"} {
		m, _ := BuiltinModel(name)
		s := m.Shape()
		if err := s.Validate(); err != nil {
			t.Errorf("%s: shape %+v does not validate: %v", name, s, err)
		}
		// The real latent attention: one latent of 512 + 64 per layer.
		if !s.MLA() || s.KVLoraRank != 512 || s.QKRopeHeadDim != 64 || s.KVBytesPerToken(2) != 61*576*2 ||
			s.FirstDenseLayers != m.DenseLayers || s.NumExperts != m.RoutedExperts {
			t.Errorf("%s: shape %+v", name, s)
		}
	}
}

// paramCount is the model's total parameter count: its weight bytes on one
// GPU holding everything with every element one byte.
func paramCount(t *testing.T, model string) float64 {
	p := builtin(t, "gb300", model, Parallelism{EP: 1})
	p.Model.WeightBytes, p.Model.EmbeddingBytes = 1, 1
	return p.WeightBytesPerGPU()
}

func TestPublishedParameterCounts(t *testing.T) {
	for _, tc := range []struct {
		model    string
		lo, hi   float64
		citation string
	}{
		// Llama 3 8B and 70B: 8.03B and 70.55B; Llama 2 7B and 70B: 6.74B and 68.98B.
		{"llama-8b", 8.02e9, 8.04e9, "Llama 3 8B"},
		{"llama-70b", 70.5e9, 70.6e9, "Llama 3 70B"},
		{"llama-2-7b", 6.73e9, 6.75e9, "Llama 2 7B"},
		{"llama-2-70b", 68.9e9, 69.0e9, "Llama 2 70B"},
		// DeepSeek-V3 report: 671B total (main model, without the MTP module).
		{"deepseek-v3", 670e9, 672e9, "DeepSeek-V3: 671B"},
		// Kimi K2: "1T total parameters" (1.03e12 by its config).
		{"kimi-k2", 1.02e12, 1.04e12, "Kimi K2: 1T"},
	} {
		if got := paramCount(t, tc.model); got < tc.lo || got > tc.hi {
			t.Errorf("%s: %.4g parameters, want in [%.4g, %.4g] (%s)", tc.model, got, tc.lo, tc.hi, tc.citation)
		}
	}
}

func TestProfileJSONRoundTrip(t *testing.T) {
	for _, pm := range [][2]string{{"h200", "llama-8b"}, {"gb300", "deepseek-v3"}, {"h100", "tiny"}} {
		p := builtin(t, pm[0], pm[1], Parallelism{})
		var buf bytes.Buffer
		if err := p.WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		q, err := ReadProfile(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatalf("%v: %v\n%s", pm, err, buf.String())
		}
		if !reflect.DeepEqual(p, q) {
			t.Errorf("%v: round trip differs:\n%+v\n%+v", pm, p, q)
		}
		var again bytes.Buffer
		_ = q.WriteJSON(&again)
		if again.String() != buf.String() {
			t.Errorf("%v: second write differs", pm)
		}
		w := []Work{{NewTokens: 1, KVBefore: 3000}, {NewTokens: 700, KVBefore: 900}}
		if p.StepCost(w) != q.StepCost(w) {
			t.Errorf("%v: loaded profile models a different cost", pm)
		}
	}
	lin, err := NewLinearProfile(ModelFromShape("tiny", bridge.Presets["tiny"]),
		LinearCoefficients{0.5, 0.01, 1e-6, 2e-5, 0.003}, "test coefficients")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "linear.json")
	f, _ := os.Create(path)
	if err := lin.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(lin, got) {
		t.Errorf("linear round trip differs:\n%+v\n%+v", lin, got)
	}
}

// mutate decodes a built-in profile's JSON as a generic map, applies edit
// and returns the JSON.
func mutate(t *testing.T, gpu, model string, edit func(m map[string]any)) []byte {
	t.Helper()
	var buf bytes.Buffer
	_ = builtin(t, gpu, model, Parallelism{}).WriteJSON(&buf)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, _ := json.Marshal(m)
	return out
}

func obj(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

func TestStrictLoading(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model string
		edit  func(m map[string]any)
		want  string
	}{
		{"unknown field", "llama-8b", func(m map[string]any) { m["gpu_name"] = "h200" }, `unknown field "gpu_name"`},
		{"unknown nested field", "llama-8b", func(m map[string]any) { obj(m, "roofline")["gemm_eff"] = 0.7 }, `unknown field "gemm_eff"`},
		{"version", "llama-8b", func(m map[string]any) { m["version"] = 3 }, "version must be 2, got 3"},
		{"version 1", "llama-8b", func(m map[string]any) { m["version"] = 1 },
			"version 1 is the earlier cost model (no FP8 GEMM efficiency, GEMM transition, kernel fixed costs or network between nodes)"},
		{"missing v2 key", "llama-8b", func(m map[string]any) { delete(obj(m, "roofline"), "gemm_kernel_ms") },
			"roofline.gemm_kernel_ms is missing: give its value and source"},
		{"tile", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "gemm_tile_tokens")["value"] = 0.5 },
			"roofline.gemm_tile_tokens.value must be a whole number of at least 1, got 0.5"},
		{"all-reduce fraction", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "allreduce_nvlink_fraction")["value"] = 2.5 },
			"roofline.allreduce_nvlink_fraction.value must be in [0, 2]"},
		{"zipf", "deepseek-v3", func(m map[string]any) { obj(obj(m, "roofline"), "expert_zipf")["value"] = -1 },
			"roofline.expert_zipf.value must be in [0, 4]"},
		{"gpus per node", "llama-8b", func(m map[string]any) { delete(obj(m, "parallelism"), "gpus_per_node") },
			"parallelism.gpus_per_node must be at least 1, got 0"},
		{"nvlink domain", "llama-8b", func(m map[string]any) { obj(obj(m, "gpu"), "nvlink_domain_gpus")["value"] = 7.5 },
			"gpu.nvlink_domain_gpus.value must be a whole number of GPUs, got 7.5"},
		{"kind", "llama-8b", func(m map[string]any) { m["kind"] = "vidur" }, `kind must be "roofline" or "linear", got "vidur"`},
		{"efficiency above 1", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "gemm_efficiency")["value"] = 1.3 },
			"roofline.gemm_efficiency.value must be in (0, 1] (a fraction of the peak), got 1.3"},
		{"negative overhead", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "step_overhead_ms")["value"] = -1 },
			"roofline.step_overhead_ms.value must not be negative, got -1"},
		{"missing source", "llama-8b", func(m map[string]any) { obj(obj(m, "gpu"), "hbm_bytes")["source"] = " " },
			"gpu.hbm_bytes.source is empty"},
		{"zero peak", "llama-8b", func(m map[string]any) { delete(obj(m, "gpu"), "bf16_flops") },
			"gpu.bf16_flops is missing: give its value and source"},
		{"no gpu", "llama-8b", func(m map[string]any) { delete(m, "gpu") }, "gpu is missing"},
		{"reserve fraction", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "reserve_fraction")["value"] = 1 },
			"roofline.reserve_fraction.value must be below 1"},
		{"host overhead", "llama-8b", func(m map[string]any) { obj(m, "host_overhead_ms")["source"] = "" },
			"host_overhead_ms.source is empty"},
		{"tp", "llama-8b", func(m map[string]any) { obj(m, "parallelism")["tp"] = 3 }, "parallelism.tp 3 must divide num_heads 32"},
		{"ep dense", "llama-8b", func(m map[string]any) { obj(m, "parallelism")["ep"] = 8 }, "parallelism.ep must be 1 for a dense model, got 8"},
		{"ep moe", "deepseek-v3", func(m map[string]any) { obj(m, "parallelism")["ep"] = 512 },
			"parallelism.ep must be in [1, routed_experts 256], got 512"},
		{"kv heads", "llama-8b", func(m map[string]any) { obj(m, "model")["num_kv_heads"] = 5 }, "model.num_kv_heads 5 must divide num_heads 32"},
		{"mla with kv heads", "deepseek-v3", func(m map[string]any) { obj(m, "model")["num_kv_heads"] = 8 },
			"model.num_kv_heads must be 0 for an MLA model (kv_lora_rank > 0), got 8"},
		{"top k", "deepseek-v3", func(m map[string]any) { obj(m, "model")["top_k"] = 300 }, "model.top_k 300 exceeds routed_experts 256"},
		{"dense layers", "deepseek-v3", func(m map[string]any) { obj(m, "model")["dense_layers"] = 61 },
			"model.dense_layers must be in [0, num_layers 61), got 61"},
		{"weight bytes", "llama-8b", func(m map[string]any) { obj(m, "model")["weight_bytes"] = 4 },
			"model.weight_bytes must be 2 (BF16), 1 (FP8) or 0.5625 (NVFP4), got 4"},
		{"linear in roofline", "llama-8b", func(m map[string]any) { m["linear"] = map[string]any{} }, "linear must be absent in a roofline profile"},
		// Each figure in its range, together a step of years (found by FuzzMeasurements).
		{"efficiency near 0", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "gemm_efficiency")["value"] = 1e-300 },
			"the profile models a step of one 8192-token prompt and 256 decodes at KV depth 4096 as +Inf ms"},
		{"overhead in the wrong unit", "llama-8b", func(m map[string]any) { obj(obj(m, "roofline"), "step_overhead_ms")["value"] = 2e6 },
			"as 2.00"},
		{"mla without heads", "deepseek-v3", func(m map[string]any) { obj(m, "model")["num_heads"] = 0 },
			"model.num_heads must be positive, got 0"},
	} {
		data := mutate(t, "h200", tc.model, tc.edit)
		_, err := ReadProfile(bytes.NewReader(data))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	var buf bytes.Buffer
	_ = builtin(t, "h200", "llama-8b", Parallelism{}).WriteJSON(&buf)
	buf.WriteString(`{"version": 1}`)
	if _, err := ReadProfile(&buf); err == nil || !strings.Contains(err.Error(), "trailing data") {
		t.Errorf("trailing object: %v", err)
	}
	if _, err := LoadProfile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("LoadProfile of a missing file must fail")
	}
}

func TestWithRanks(t *testing.T) {
	p := builtin(t, "h200", "deepseek-v3", Parallelism{})
	q, err := p.WithRanks(32)
	if err != nil {
		t.Fatal(err)
	}
	if q.Parallelism.EP != 32 || p.Parallelism.EP != 8 {
		t.Errorf("EP: copy %d (want 32), original %d (want 8)", q.Parallelism.EP, p.Parallelism.EP)
	}
	if q.WeightBytesPerGPU() >= p.WeightBytesPerGPU() {
		t.Error("more expert-parallel GPUs must hold fewer weights each")
	}
	if _, err := p.WithRanks(512); err == nil || !strings.Contains(err.Error(), "parallelism.ep") {
		t.Errorf("512 ranks of 256 experts: %v", err)
	}
	d := builtin(t, "h200", "llama-8b", Parallelism{})
	e, err := d.WithRanks(64)
	if err != nil || e.Parallelism != d.Parallelism {
		t.Errorf("dense WithRanks: %v, %+v", err, e.Parallelism)
	}
}

func TestProfileFromMeasurements(t *testing.T) {
	base := builtin(t, "h200", "llama-8b", Parallelism{})
	m := Measurements{Version: 1, GPU: "h200", Source: "device-check test", GEMMTFLOPS: 742.125,
		PrefillAttentionTFLOPS: 494.75, DecodeAttentionGBPS: 3840, StepOverheadMS: 0.25, ElementwiseGBPS: 4320,
		FP8GEMMTFLOPS: 1385.3, GEMMKernelMS: 0.004, AttentionKernelMS: 0.009, ElementwiseKernelMS: 0.0025}
	p, err := ProfileFromMeasurements(base, m)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Roofline
	near(t, "gemm efficiency", r.GEMMEfficiency.Value, 0.75)               // 742.125 / 989.5
	near(t, "prefill efficiency", r.PrefillAttentionEfficiency.Value, 0.5) // 494.75 / 989.5
	near(t, "decode efficiency", r.DecodeAttentionEfficiency.Value, 0.8)   // 3840 / 4800
	near(t, "elementwise efficiency", r.ElementwiseEfficiency.Value, 0.9)  // 4320 / 4800
	near(t, "step overhead", r.StepOverheadMS.Value, 0.25)
	near(t, "fp8 gemm efficiency", r.FP8GEMMEfficiency.Value, 0.7) // 1385.3 / 1979
	near(t, "gemm kernel", r.GEMMKernelMS.Value, 0.004)
	near(t, "attention kernel", r.AttentionKernelMS.Value, 0.009)
	near(t, "elementwise kernel", r.ElementwiseKernelMS.Value, 0.0025)
	if r.GEMMBandwidthEfficiency != base.Roofline.GEMMBandwidthEfficiency {
		t.Error("an omitted optional key must keep the base coefficient")
	}
	if !strings.HasPrefix(r.GEMMEfficiency.Source, "measured: device-check test") {
		t.Errorf("source %q", r.GEMMEfficiency.Source)
	}
	if base.Roofline.GEMMEfficiency.Value != 0.72 {
		t.Error("the base profile must not change")
	}
	for _, tc := range []struct {
		edit func(*Measurements)
		want string
	}{
		{func(m *Measurements) { m.GPU = "h100" }, `measured on gpu "h100" but the profile is for "h200"`},
		{func(m *Measurements) { m.GEMMTFLOPS = 1200 }, "gemm_tflops = 1200 exceeds the datasheet peak 989.5 of h200"},
		{func(m *Measurements) { m.FP8GEMMTFLOPS = 2500 }, "fp8_gemm_tflops = 2500 exceeds the datasheet peak 1979 of h200"},
		{func(m *Measurements) { m.AttentionKernelMS = -1 }, "attention_kernel_ms must be positive"},
		{func(m *Measurements) { m.DecodeAttentionGBPS = 0 }, "decode_attention_gbps must be positive"},
		{func(m *Measurements) { m.Source = "" }, "source is empty"},
		{func(m *Measurements) { m.Version = 0 }, "version must be 1"},
	} {
		bad := m
		tc.edit(&bad)
		if _, err := ProfileFromMeasurements(base, bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "m.json")
	_ = os.WriteFile(good, []byte(`{"version":1,"gpu":"h200","source":"s","gemm_tflops":700,
		"prefill_attention_tflops":600,"decode_attention_gbps":4000,"step_overhead_ms":0.1}`), 0o644)
	if got, err := LoadMeasurements(good); err != nil || got.GEMMTFLOPS != 700 {
		t.Errorf("LoadMeasurements: %+v, %v", got, err)
	}
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`{"version":1,"gemm_tflop":700}`), 0o644)
	if _, err := LoadMeasurements(bad); err == nil || !strings.Contains(err.Error(), `unknown field "gemm_tflop"`) {
		t.Errorf("unknown key: %v", err)
	}
}
