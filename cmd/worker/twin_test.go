package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/internal/racetest"
)

// twinRun is a small twin run of the built-in sample (arrivals replayed on
// the virtual clock, so no --arrival-scale 0 needed: nothing sleeps).
var twinRun = []string{"run", "--engine", "twin", "--model", "llama-8b", "--progress", "off", "--report", "json", "--limit", "24"}

type twinReport struct {
	Clock         string  `json:"clock"`
	GPU           string  `json:"gpu"`
	DurationS     float64 `json:"duration_s"`
	WallS         float64 `json:"wall_s"`
	LockstepWaste float64 `json:"lockstep_waste"`
	OutputDigest  string  `json:"output_digest"`
	Requests      struct{ Completed int }
	TTFT          struct{ P50 float64 } `json:"ttft_ms"`
}

func runTwin(t *testing.T, args ...string) twinReport {
	t.Helper()
	code, stdout, stderr := runCLI(t, append(append([]string{}, twinRun...), args...)...)
	require.Equal(t, 0, code, stderr)
	var r twinReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &r), stdout)
	return r
}

// TestTwinRunIsVirtualAndDeterministic: the twin reports virtual time, a
// rerun prints the same digest and latencies, the rank count changes
// neither the digest (tokens depend only on content) nor breaks the run,
// and the modelled times respond to the GPU.
func TestTwinRunIsVirtualAndDeterministic(t *testing.T) {
	a := runTwin(t, "--ranks", "4", "--pages", "0")
	require.Equal(t, "virtual", a.Clock)
	require.Equal(t, "h200", a.GPU)
	require.Equal(t, 24, a.Requests.Completed)
	require.Greater(t, a.DurationS, 0.0)
	require.Greater(t, a.TTFT.P50, 0.0)
	b := runTwin(t, "--ranks", "4", "--pages", "0")
	require.Equal(t, a, func() twinReport { b.WallS = a.WallS; return b }(), "a rerun is identical in virtual time")
	one := runTwin(t, "--ranks", "1", "--pages", "0", "--overlap", "off")
	require.Equal(t, a.OutputDigest, one.OutputDigest)
	slow := runTwin(t, "--ranks", "4", "--pages", "0", "--gpu", "h100")
	require.Equal(t, a.OutputDigest, slow.OutputDigest)
	require.Greater(t, slow.TTFT.P50, a.TTFT.P50, "an H100 has less memory bandwidth than an H200")
}

// TestTwinRefusals: a model that does not fit the GPU is refused with the
// numbers; twin flags need the twin; a bad profile names the key.
func TestTwinRefusals(t *testing.T) {
	code, _, stderr := runCLI(t, append(append([]string{}, twinRun...), "--model", "llama-70b", "--gpu", "h100", "--pages", "0")...)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "141.1 GB of weights per GPU")
	require.Contains(t, stderr, "--tp 2")
	code, _, stderr = runCLI(t, append(append([]string{}, twinRun...), "--model", "llama-70b", "--gpu", "h100", "--pages", "0", "--tp", "2")...)
	require.Equal(t, 0, code, stderr)

	code, _, stderr = runCLI(t, "run", "--engine", "fake", "--gpu", "b200")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--gpu is a setting of the digital twin")

	bad := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version": 3}`), 0o644))
	code, _, stderr = runCLI(t, append(append([]string{}, twinRun...), "--cost-profile", bad)...)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--cost-profile")
	require.Contains(t, stderr, "version")
}

// TestTwinProfileCommand: the built-in profile prints and loads back; a
// measured file re-bases it; the fit reads iteration logs.
func TestTwinProfileCommand(t *testing.T) {
	code, stdout, stderr := runCLI(t, "twin-profile", "--gpu", "b200", "--model", "deepseek-v3", "--ranks", "8")
	require.Equal(t, 0, code, stderr)
	path := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(path, []byte(stdout), 0o644))
	p, err := twin.LoadProfile(path)
	require.NoError(t, err)
	require.Equal(t, "b200", p.GPU.Name)
	require.Equal(t, 8, p.Parallelism.EP)

	m := filepath.Join(t.TempDir(), "m.json")
	require.NoError(t, os.WriteFile(m, []byte(`{"version": 1, "gpu": "h200", "source": "test card", "gemm_tflops": 600,
		"prefill_attention_tflops": 450, "decode_attention_gbps": 3000, "step_overhead_ms": 0.5}`), 0o644))
	code, stdout, stderr = runCLI(t, "twin-profile", "--gpu", "h200", "--measured", m)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "measured: test card")

	// A fit of the twin's own logs recovers a profile that runs.
	dir := t.TempDir()
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	code, _, stderr = runCLI(t, append(append([]string{}, twinRun...), "--ranks", "2", "--pages", "0", "--limit", "64",
		"--iter-log", filepath.Join(dir, "iter.{rank}.jsonl"))...)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = runCLI(t, "twin-profile", "--fit", "--model", "llama-8b", filepath.Join(dir, "iter.{rank}.jsonl"))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "per-step error")
	require.True(t, strings.Contains(stdout, `"kind": "linear"`), stdout)
	fitted := filepath.Join(dir, "fit.json")
	require.NoError(t, os.WriteFile(fitted, []byte(stdout), 0o644))
	code, _, stderr = runCLI(t, append(append([]string{}, twinRun...), "--cost-profile", fitted, "--pages", "4096")...)
	require.Equal(t, 0, code, stderr)

	code, _, stderr = runCLI(t, "twin-profile", "--fit", filepath.Join(dir, "nothing.{rank}.jsonl"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "no file matches")
}

// TestTwinDeploymentFlags: --weight-dtype, --kv-dtype, --gpus-per-node and
// --expert-zipf reach the profile in `run` and `twin-profile`, are refused
// with the allowed values, and need the twin.
func TestTwinDeploymentFlags(t *testing.T) {
	code, stdout, stderr := runCLI(t, "twin-profile", "--model", "llama-8b", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
		"--gpus-per-node", "4")
	require.Equal(t, 0, code, stderr)
	p, err := twin.ReadProfile(strings.NewReader(stdout))
	require.NoError(t, err)
	require.Equal(t, 1.0, p.Model.WeightBytes)
	require.Equal(t, 1, p.Model.KVBytes)
	require.Equal(t, 2, p.Model.EmbeddingBytes, "the embedding and LM head stay BF16")
	require.Equal(t, 4, p.Parallelism.GPUsPerNode)
	code, stdout, stderr = runCLI(t, "twin-profile", "--gpu", "b200", "--model", "deepseek-v3", "--ranks", "8",
		"--weight-dtype", "nvfp4", "--kv-dtype", "fp8")
	require.Equal(t, 0, code, stderr)
	p, err = twin.ReadProfile(strings.NewReader(stdout))
	require.NoError(t, err)
	require.Equal(t, 0.5625, p.Model.WeightBytes, "NVFP4: 4 bits and an 8-bit scale per 16")
	require.Positive(t, p.GPU.FP4FLOPS.Value)
	code, stdout, stderr = runCLI(t, "twin-profile", "--model", "deepseek-v3", "--expert-zipf", "0.8")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"value": 0.8`)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--weight-dtype", "fp4"}, `--weight-dtype: unknown dtype "fp4" (allowed: bf16, fp8, nvfp4 (weights only))`},
		{[]string{"--kv-dtype", "int8"}, `--kv-dtype: unknown dtype "int8" (allowed: bf16, fp8, nvfp4 (weights only))`},
		{[]string{"--weight-dtype", "nvfp4"}, "nvfp4 weights need FP4 tensor cores, which the h200 has not"},
		{[]string{"--kv-dtype", "nvfp4"}, "the twin's KV cache is bf16 or fp8, not nvfp4"},
		{[]string{"--gpus-per-node", "-1"}, "--gpus-per-node must be at least 1"},
		{[]string{"--expert-zipf", "0.5"}, "--expert-zipf 0.5: model llama-8b has no routed experts"},
		{[]string{"--expert-zipf", "9"}, "--expert-zipf must be a Zipf exponent in [0, 4]"},
		{[]string{"--twin-cuda-graph", "always"}, `--twin-cuda-graph "always" is not allowed (allowed: rank, fleet)`},
		{[]string{"--twin-cuda-graph-max-batch-size", "64"}, "--twin-cuda-graph-max-batch-size 64 needs --twin-cuda-graph fleet"},
		{[]string{"--twin-cuda-graph", "fleet", "--twin-cuda-graph-max-batch-size", "-2"}, "--twin-cuda-graph-max-batch-size must be at least 1"},
		{[]string{"--twin-moe-dp-padding"}, "--twin-moe-dp-padding: model llama-8b has no routed experts"},
	} {
		code, _, stderr := runCLI(t, append(append([]string{}, twinRun...), tc.args...)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, _, stderr = runCLI(t, "run", "--engine", "fake", "--kv-dtype", "fp8")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--kv-dtype is a setting of the digital twin")

	code, _, stderr = runCLI(t, "run", "--engine", "fake", "--twin-cuda-graph", "fleet")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--twin-cuda-graph is a setting of the digital twin")

	// FP8 weights and KV: the same tokens, sooner.
	bf := runTwin(t, "--ranks", "2", "--pages", "0")
	fp := runTwin(t, "--ranks", "2", "--pages", "0", "--weight-dtype", "fp8", "--kv-dtype", "fp8")
	require.Equal(t, bf.OutputDigest, fp.OutputDigest)
	require.Less(t, fp.DurationS, bf.DurationS, "FP8 weights halve the bytes every decode reads")
}

// TestTwinAttentionDPCoupling: TensorRT-LLM's fleet-wide CUDA graphs and
// MoE padding keep the tokens and cost the fleet time; off is the default.
func TestTwinAttentionDPCoupling(t *testing.T) {
	moe := []string{"--model", "deepseek-v3", "--ranks", "8", "--pages", "0"}
	off := runTwin(t, moe...)
	graph := runTwin(t, append(moe, "--twin-cuda-graph", "fleet")...)
	pad := runTwin(t, append(moe, "--twin-moe-dp-padding")...)
	require.Equal(t, off.OutputDigest, graph.OutputDigest)
	require.Equal(t, off.OutputDigest, pad.OutputDigest)
	require.Greater(t, graph.DurationS, off.DurationS, "a context on one rank takes every rank off its CUDA graph")
	require.Greater(t, pad.DurationS, off.DurationS, "the experts compute every rank padded to the largest")
	same := runTwin(t, append(moe, "--twin-cuda-graph", "rank")...)
	require.Equal(t, off.DurationS, same.DurationS, "rank is the default")
}

// TestTwinValidateCommand: the validation prints every operator table with
// its summary; a bad table name is a usage error.
func TestTwinValidateCommand(t *testing.T) {
	code, stdout, stderr := runCLI(t, "twin-validate", "--only", "operators")
	require.Equal(t, 0, code, stderr)
	for _, g := range []string{"vidur-gemm", "vidur-elementwise", "deepgemm-fp8", "ort-decode", "vidur-allreduce", "## summary"} {
		require.Contains(t, stdout, g)
	}
	code, stdout, stderr = runCLI(t, "twin-validate", "--sources")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "github.com/microsoft/vidur")
	code, _, stderr = runCLI(t, "twin-validate", "--only", "gemm")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown table "gemm"`)
}

// TestRunProfiles: --cpuprofile and --memprofile write Go profiles of the
// run (gzip-compressed protocol buffers, as go tool pprof reads them); a
// path that cannot be created is refused naming the flag.
func TestRunProfiles(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	runTwin(t, "--ranks", "2", "--pages", "0", "--cpuprofile", cpu, "--memprofile", mem)
	for _, p := range []string{cpu, mem} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Greater(t, len(b), 2, p)
		require.Equal(t, []byte{0x1f, 0x8b}, b[:2], "%s is not a gzip-compressed profile", p)
	}
	code, _, stderr := runCLI(t, append(append([]string{}, twinRun...), "--memprofile", filepath.Join(dir, "no", "such", "dir", "m"))...)
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "--memprofile")
}

// TestTwinThreadsChangeNothing: the twin's ranks driven by one, two or
// three threads (--twin-threads) print the same report (all but the wall
// time), over the features whose state lives on each rank: calibration,
// ADP balance, the conversation router, KV events, a small pool with
// recompute preemption, an MoE model. Under -race this is also the check
// that no rank shares mutable state with another outside the collectives.
func TestTwinThreadsChangeNothing(t *testing.T) {
	dir := t.TempDir()
	limit := racetest.Size(64, 24) // the race pass checks the sharing, on a short run
	threadCounts := []string{"1", "2", "3"}
	if racetest.Enabled {
		threadCounts = threadCounts[:2]
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"dense", []string{"--model", "llama-8b", "--ranks", "16", "--pages", "0", "--ctx-cost", "auto",
			"--attention-dp-balance", "--kv-events", filepath.Join(dir, "ev-{rank}.jsonl")}},
		{"moe-preempt", []string{"--model", "qwen3-30b-a3b", "--ranks", "5", "--pages", "170", "--tokens-per-page", "16",
			"--arrival-scale", "0", "--attention-dp-cost-leveling", "--twin-moe-dp-padding", "--twin-cuda-graph", "fleet"}},
		{"iter-log", []string{"--model", "llama-8b", "--ranks", "16", "--pages", "0", "--overlap", "off",
			"--iter-log", filepath.Join(dir, "it-{rank}.jsonl")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var first map[string]any
			for _, threads := range threadCounts {
				code, stdout, stderr := runCLI(t, append(append(append([]string{}, twinRun...), c.args...),
					"--limit", strconv.Itoa(limit), "--twin-threads", threads)...)
				require.Equal(t, 0, code, stderr)
				var rep map[string]any
				require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
				for _, k := range []string{"wall_s", "output_tokens_per_s_wall"} {
					delete(rep, k)
				}
				require.Equal(t, float64(limit), rep["requests"].(map[string]any)["completed"])
				if first == nil {
					first = rep
					if c.name == "moe-preempt" && !racetest.Enabled {
						require.NotZero(t, rep["preemptions"].(map[string]any)["recompute"])
					}
					continue
				}
				require.Equal(t, first, rep, "--twin-threads %s", threads)
			}
		})
	}
	code, _, stderr := runCLI(t, append(append([]string{}, twinRun...), "--twin-threads", "-1")...)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--twin-threads must be between 0 (automatic) and 256, got -1")
	code, _, stderr = runCLI(t, "run", "--engine", "fake", "--twin-threads", "2", "--limit", "2", "--progress", "off")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--twin-threads is a setting of the digital twin: it needs --engine twin")
}
