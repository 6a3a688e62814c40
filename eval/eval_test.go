package eval

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
)

// TestEvalWritesTheReport runs a small evaluation on the twin (a slice of
// the conversation trace, a small MoE fleet) and checks the report
// directory: the table with every configuration, the calibration and its
// plot, the plots as real PNGs, the JSON summary and the commands.
//
// A whole evaluation is 19 single-goroutine twin runs: it stays out of the
// race pass, where it took ten times as long and raced nothing. 400 requests
// are the fewest with which A's logs of this slice still give a fit (300
// give none, and B and C are then skipped).
func TestEvalWritesTheReport(t *testing.T) {
	if racetest.Enabled {
		t.Skip("a whole evaluation: end-to-end, out of the race pass")
	}
	trace := filepath.Join("..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	if _, err := os.Stat(trace); err != nil {
		t.Fatalf("the Mooncake traces are expected in ../shared/data/mooncake beside the repository: %v", err)
	}
	out := t.TempDir()
	e := Defaults()
	e.Trace, e.Out, e.Limit, e.Ranks, e.CPU = trace, out, 400, 8, false
	require.NoError(t, e.Validate())
	var progress strings.Builder
	ev, err := Run(e, &progress)
	require.NoError(t, err, progress.String())
	var summary bytes.Buffer
	require.NoError(t, ev.WriteSummary(&summary))
	stdout := summary.String()
	var sum struct {
		Capacity float64 `json:"context_capacity_prompt_tokens_per_s"`
		Runs     []struct {
			Config, Workload, Load, Command string
			Completed                       int
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &sum), stdout)
	require.Greater(t, sum.Capacity, 0.0)
	seen := map[string]bool{}
	for _, r := range sum.Runs {
		require.Equal(t, 400, r.Completed, "%s %s %s", r.Config, r.Workload, r.Load)
		require.True(t, strings.HasPrefix(r.Command, "bin/worker run") || strings.Contains(r.Command, " bin/worker run "), r.Command)
		seen[r.Config+"/"+r.Workload+"/"+r.Load] = true
		if r.Config == "J" { // the ladder's step: the router without demotion
			require.Contains(t, r.Command, "--router conversation")
			require.NotContains(t, r.Command, "TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS")
		}
	}
	for _, c := range []string{"A", "B", "J", "C", "D", "E", "F", "G", "H", "I"} {
		for _, w := range []string{"context/saturated", "aggregated/trace", "aggregated/saturated"} {
			if strings.Contains("EFGHI", c) && w == "context/saturated" {
				require.False(t, seen[c+"/"+w], "ADP Balance, placement and cost leveling run on aggregated serving only")
				continue
			}
			require.True(t, seen[c+"/"+w], "run %s/%s missing (a failed fit skips B and C: check the calibration)", c, w)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	for _, want := range []string{"| A | context | saturated |", "| D | aggregated | trace |", "export TLLM_V2_CTX_COST_KV_OFFSET=",
		"![TTFT CDFs](ttft_cdf.png)", "![timeline](timeline.png)", "![waste](waste.png)", "![balance](balance.png)",
		"| E | aggregated | saturated |", "--attention-dp-balance", "| G | aggregated | trace |", "--new-conv-placement least_tokens",
		"| H | aggregated | saturated |", "| I | aggregated | trace |", "--attention-dp-cost-leveling", "| J | context | saturated |", "| J | aggregated | trace |", "## Commands"} {
		require.Contains(t, string(md), want)
	}
	for _, name := range []string{"calibration.png", "ttft_cdf.png", "timeline.png", "waste.png", "balance.png"} {
		f, err := os.Open(filepath.Join(out, name))
		require.NoError(t, err, name)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, name)
		require.Equal(t, 1600, img.Bounds().Dx(), name)
	}
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
