package eval

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
)

// TestEvalWritesTheReport runs a small evaluation on the twin (a slice of
// the conversation trace, DeepSeek-V3 on 8 ranks, a two-point sweep) and
// checks the report directory: every configuration where it belongs, the
// sweep's goodput and knees, the calibration and its plot, the plots as
// real PNGs, the JSON summary and the commands.
//
// A whole evaluation is about 30 twin runs: it stays out of the race pass,
// where it took ten times as long (TestEvalInParallel races the runs in
// flight instead). 400 requests are the fewest with which A's logs of this
// slice still give a fit (300 give none, and B, J and C are then skipped).
func TestEvalWritesTheReport(t *testing.T) {
	if racetest.Enabled {
		t.Skip("a whole evaluation: end-to-end, out of the race pass")
	}
	out := t.TempDir()
	e := Defaults()
	e.Trace, e.Out, e.Limit, e.Ranks, e.CPU = conversationTrace(t), out, 400, 8, false
	e.Models, e.Sweep = []string{"deepseek-v3"}, []float64{0.5, 1.1}
	e.Configs = append(e.Configs, "G", "L")
	require.NoError(t, e.Validate())
	var progress strings.Builder
	ev, err := Run(e, &progress)
	require.NoError(t, err, progress.String())
	require.Contains(t, progress.String(), "deepseek-v3: the sweep", "where the time went")
	var summary bytes.Buffer
	require.NoError(t, ev.WriteSummary(&summary))
	stdout := summary.String()
	var sum struct {
		SLOTTFT float64 `json:"slo_ttft_ms"`
		Models  []struct {
			Model    string
			Capacity map[string]float64 `json:"capacity_prompt_tokens_per_s"`
			Knees    []knee             `json:"knees"`
		} `json:"models"`
		Runs []struct {
			Config, Workload, Load, Command string
			Completed                       int
			SLOMet                          int     `json:"slo_met"`
			Offered                         float64 `json:"offered_requests_per_s"`
			Goodput                         float64 `json:"goodput_requests_per_s"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &sum), stdout)
	require.Equal(t, 10000.0, sum.SLOTTFT)
	require.Len(t, sum.Models, 1)
	require.Greater(t, sum.Models[0].Capacity["context"], 0.0)
	require.Greater(t, sum.Models[0].Capacity["aggregated"], 0.0)
	require.Len(t, sum.Models[0].Knees, 12, "the five ladder configurations on both workloads, ADP Balance (E, F) on aggregated serving")
	seen := map[string]bool{}
	for _, r := range sum.Runs {
		require.Equal(t, 400, r.Completed, "%s %s %s", r.Config, r.Workload, r.Load)
		require.LessOrEqual(t, r.SLOMet, r.Completed)
		require.True(t, strings.HasPrefix(r.Command, "bin/worker run") || strings.Contains(r.Command, " bin/worker run "), r.Command)
		seen[r.Config+"/"+r.Workload+"/"+r.Load] = true
		if r.Config != "capacity" {
			require.Greater(t, r.Offered, 0.0, "%s %s %s", r.Config, r.Workload, r.Load)
		}
		if r.Config == "J" { // the ladder's step: the router without demotion
			require.Contains(t, r.Command, "--router conversation")
			require.NotContains(t, r.Command, "TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS")
		}
	}
	require.True(t, seen["capacity/context/all-at-once"] && seen["capacity/aggregated/all-at-once"])
	for _, c := range []string{"A", "B", "J", "C", "D", "E", "F", "G", "L", "H", "I", "K"} {
		for _, w := range []string{"context/0.50×", "context/1.10×", "aggregated/0.50×", "aggregated/1.10×"} {
			if strings.Contains("EF", c) && !strings.HasPrefix(w, "aggregated/") {
				require.False(t, seen[c+"/"+w], "ADP Balance: aggregated serving only")
				continue
			}
			if strings.Contains("GHIKL", c) && w != "aggregated/1.10×" {
				require.False(t, seen[c+"/"+w], "placement and cost leveling: aggregated serving at the highest load only")
				continue
			}
			require.True(t, seen[c+"/"+w], "run %s/%s missing (a failed fit skips B, J and C: check the calibration)", c, w)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	for _, want := range []string{"| A | context | 0.50× |", "| D | aggregated | 1.10× |", "export TLLM_V2_CTX_COST_KV_OFFSET=",
		"### Knees", "| C | J + long-prefill demotion |", "![goodput_vs_rate](goodput_vs_rate-deepseek-v3.png)",
		"![latency_vs_rate](latency_vs_rate-deepseek-v3.png)", "**D's online calibrator**", "Where the time went",
		"![TTFT CDFs](ttft_cdf-deepseek-v3.png)", "![timeline](timeline-deepseek-v3.png)", "![waste](waste-deepseek-v3.png)",
		"![balance](balance-deepseek-v3.png)", "--attention-dp-balance", "--new-conv-placement least_tokens",
		"--attention-dp-cost-leveling", "| **G** | C + least_tokens placement |", "| E | aggregated | 0.50× |",
		"| **E** | A + ADP Balance | every load, aggregated serving |", "## Commands"} {
		require.Contains(t, string(md), want)
	}
	for _, name := range []string{"calibration-deepseek-v3.png", "goodput_vs_rate-deepseek-v3.png", "latency_vs_rate-deepseek-v3.png",
		"ttft_cdf-deepseek-v3.png", "timeline-deepseek-v3.png", "waste-deepseek-v3.png", "balance-deepseek-v3.png"} {
		f, err := os.Open(filepath.Join(out, name))
		require.NoError(t, err, name)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, name)
		require.GreaterOrEqual(t, img.Bounds().Dx(), 1600, name)
	}
}

// TestEvalInParallel runs a tiny sweep with two runs in flight and checks
// that the report does not depend on how many run at once. Under the race
// pass it runs once, with two in flight and A alone: the runs share nothing.
func TestEvalInParallel(t *testing.T) {
	report := func(jobs int, configs ...string) []byte {
		e := Defaults()
		e.Trace, e.Out, e.Limit, e.Ranks, e.CPU, e.Jobs = conversationTrace(t), t.TempDir(), 16, 2, false, jobs
		e.Models, e.Sweep, e.Configs = []string{"moe-tiny"}, []float64{0.5, 1.1}, configs
		require.NoError(t, e.Validate())
		var progress strings.Builder
		ev, err := Run(e, &progress)
		require.NoError(t, err, progress.String())
		require.Len(t, ev.runs, 2+4*len(configs))
		var b strings.Builder
		for _, r := range ev.runs {
			fmt.Fprintf(&b, "%s %s %s %d %d %v %v\n", r.Config, r.Workload, r.Load, r.Completed, r.SLOMet, r.TTFT, r.TPOT)
		}
		return []byte(b.String())
	}
	if racetest.Enabled {
		report(2, "A")
		return
	}
	require.Equal(t, string(report(1, "A", "D")), string(report(2, "A", "D")))
}

// TestEvalClearsAnEarlierEvaluation: a plot, log or report of an earlier
// evaluation into the same directory does not survive beside the new one,
// and files the evaluation does not write are left alone.
func TestEvalClearsAnEarlierEvaluation(t *testing.T) {
	out := t.TempDir()
	stale := []string{"calibration-cpu.png", "goodput_vs_rate-llama-8b.png", "logs/llama-8b-B-context-0.50-twin.log", "iter/A-context-cpu.0.jsonl"}
	require.NoError(t, os.MkdirAll(filepath.Join(out, "logs"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(out, "iter"), 0o755))
	for _, n := range append(slices.Clone(stale), "notes.txt", "logs/mine.txt", "report.md", "summary.json") {
		require.NoError(t, os.WriteFile(filepath.Join(out, n), []byte("x"), 0o644))
	}
	e := Defaults()
	e.Trace, e.Out, e.Limit, e.Ranks, e.CPU = conversationTrace(t), out, 16, 2, false
	e.Models, e.Sweep, e.Configs = []string{"moe-tiny"}, []float64{0.5, 1.1}, []string{"A"}
	require.NoError(t, e.Validate())
	var progress strings.Builder
	_, err := Run(e, &progress)
	require.NoError(t, err, progress.String())
	for _, n := range stale {
		_, err := os.Stat(filepath.Join(out, n))
		require.True(t, os.IsNotExist(err), "%s: an earlier evaluation's output survived", n)
	}
	for _, n := range []string{"notes.txt", "logs/mine.txt"} {
		b, err := os.ReadFile(filepath.Join(out, n))
		require.NoError(t, err, n)
		require.Equal(t, "x", string(b), n)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "## moe-tiny")
	_, err = os.Stat(filepath.Join(out, "goodput_vs_rate-moe-tiny.png"))
	require.NoError(t, err)
}

// TestEvalPoissonArrivals: --arrivals poisson reaches every twin run and
// the report; the slice then arrives one request at a time.
func TestEvalPoissonArrivals(t *testing.T) {
	e := Defaults()
	e.Trace, e.Out, e.Limit, e.Ranks, e.CPU = conversationTrace(t), t.TempDir(), 32, 2, false
	e.Models, e.Sweep, e.Configs, e.Arrivals = []string{"moe-tiny"}, []float64{0.5, 1.1}, []string{"A"}, "poisson"
	require.NoError(t, e.Validate())
	var progress strings.Builder
	ev, err := Run(e, &progress)
	require.NoError(t, err, progress.String())
	for _, r := range ev.runs {
		require.Contains(t, r.Command, "--arrivals poisson", r.Command)
	}
	require.Equal(t, 32, ev.models[0].Instants, "a Poisson process: every request at its own time")
	require.Equal(t, 1, ev.models[0].MaxBurst)
	md, err := os.ReadFile(filepath.Join(e.Out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "--arrivals poisson` (")
	require.Contains(t, string(md), "is replayed as a Poisson process at the trace's mean rate")
	require.Contains(t, string(md), "every request at its own time")

	e.Arrivals = "bursty"
	require.ErrorContains(t, e.Validate(), `--arrivals must be trace or poisson, got "bursty"`)
}

// TestWholeTicks: iteration ticks read as whole numbers, never "175.00".
func TestWholeTicks(t *testing.T) {
	labelled := 0
	for _, tk := range (wholeTicks{}).Ticks(174, 233) {
		if tk.Label != "" {
			labelled++
			require.NotContains(t, tk.Label, ".", tk.Label)
		}
	}
	require.Greater(t, labelled, 1)
}

// TestKnee: the knee is the highest point whose goodput keeps 90 % of the
// offer; a failing point beneath it is flagged; none below the sweep.
func TestKnee(t *testing.T) {
	run := func(x, offered, goodput float64) *evalRun {
		return &evalRun{LoadX: x, OfferedRPS: offered, GoodputRPS: goodput}
	}
	k := kneeOf("B", "context", []*evalRun{run(0.3, 1, 1), run(0.5, 2, 1.85), run(0.7, 3, 2.6), run(0.9, 4, 3)})
	require.Equal(t, knee{Config: "B", Workload: "context", Points: 4, LoadX: 0.5, RPS: 2, Goodput: 1.85, Below: true}, k)
	k = kneeOf("B", "context", []*evalRun{run(0.3, 1, 0.5), run(0.5, 2, 1.9)})
	require.Equal(t, 0.5, k.LoadX)
	require.False(t, k.Below, "a lower point misses the objective")
	require.Contains(t, kneeText(k, []float64{0.3, 0.5}), "the sweep's top")
	k = kneeOf("B", "context", []*evalRun{run(0.3, 1, 0.2), run(0.5, 2, 0.1)})
	require.Zero(t, k.LoadX)
	require.Equal(t, "below the sweep (< 0.30×)", kneeText(k, []float64{0.3, 0.5}))
}

// TestValidateRefuses: bad settings are refused before any run, naming
// the flag.
func TestValidateRefuses(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(e *Options) { e.Sweep = nil }, "--sweep"},
		{func(e *Options) { e.Sweep = []float64{0.5, 0.3} }, "--sweep: the loads must ascend"},
		{func(e *Options) { e.Sweep = []float64{0, 0.3} }, "--sweep: load 0"},
		{func(e *Options) { e.Configs = []string{"A", "Z"} }, `--configs: unknown configuration "Z"`},
		{func(e *Options) { e.Configs = []string{"A", "A"} }, "--configs: A is named twice"},
		{func(e *Options) { e.Models = []string{"llama-405b"} }, `unknown model "llama-405b"`},
		{func(e *Options) { e.Models = nil }, "--model"},
		{func(e *Options) { e.SLOTPOT = 0 }, "--slo-ttft and --slo-tpot must be positive"},
		{func(e *Options) { e.Jobs = 0 }, "--jobs must be at least 1"},
	} {
		e := Defaults()
		e.Trace, e.Out = "t.jsonl", "out"
		tc.edit(&e)
		err := e.Validate()
		require.ErrorContains(t, err, tc.want)
	}
	// A trace it cannot read is refused in Validate, before Run clears the
	// directory's earlier report.
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1]}`+"\n"), 0o644))
	for trace, want := range map[string]string{bad: "bad.jsonl:1: field \"hash_ids\" has 1 blocks", "missing.jsonl": "--trace: trace: open missing.jsonl"} {
		e := Defaults()
		e.Trace, e.Out = trace, "out"
		require.ErrorContains(t, e.Validate(), want)
	}
	_, err := ParseSweep("0.3,x")
	require.ErrorContains(t, err, `--sweep: "x" is not a number`)
	x, err := ParseSweep(" 0.3, 0.5 ,")
	require.NoError(t, err)
	require.Equal(t, []float64{0.3, 0.5}, x)
}

func conversationTrace(t *testing.T) string {
	trace := filepath.Join("..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	if _, err := os.Stat(trace); err != nil {
		t.Fatalf("the Mooncake traces are expected in ../shared/data/mooncake beside the repository: %v", err)
	}
	return trace
}

// TestDeploymentArgs: the twin's deployment settings reach every run's
// command line only when set (the runs keep the model's own dtypes, the
// GPU's NVLink domain and uniform routing otherwise).
func TestDeploymentArgs(t *testing.T) {
	e := Defaults()
	require.Empty(t, e.deploymentArgs())
	e.WeightDType, e.KVDType, e.GPUsPerNode, e.ExpertZipf = "fp8", "bf16", 16, 0.5
	require.Equal(t, []string{"--weight-dtype", "fp8", "--kv-dtype", "bf16", "--gpus-per-node", "16", "--expert-zipf", "0.5"},
		e.deploymentArgs())
	e = Defaults()
	e.TwinCUDAGraph, e.TwinCUDAGraphMaxBatch, e.TwinMoEPadding = "fleet", 256, true
	require.Equal(t, []string{"--twin-cuda-graph", "fleet", "--twin-cuda-graph-max-batch-size", "256", "--twin-moe-dp-padding"},
		e.deploymentArgs())
}
