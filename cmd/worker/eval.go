package main

// `worker eval`: the flags of the evaluation package's side-by-side runs of
// the equal-cost, demotion and online-calibrator configurations (docs/eval.md).

import (
	"errors"
	"flag"
	"io"
	"strings"

	"github.com/lockstep-ai/lockstep/eval"
	"github.com/lockstep-ai/lockstep/internal/usage"
)

// runEval is `worker eval`.
func runEval(args []string, stdout, stderr io.Writer) error {
	e := eval.Defaults()
	var jsonOut bool
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&e.Engine, "engine", e.Engine, "engine of the main evaluation: twin (cpu runs a small real-compute check with --cpu)")
	fs.StringVar(&e.GPU, "gpu", e.GPU, "the twin's GPU")
	models := fs.String("model", strings.Join(e.Models, ","), "the twin's models, comma-separated: one report section each")
	fs.StringVar(&e.WeightDType, "weight-dtype", e.WeightDType, "the twin's weight element type: bf16, fp8 or nvfp4 (default: the model's)")
	fs.StringVar(&e.KVDType, "kv-dtype", e.KVDType, "the twin's KV-cache element type: bf16 or fp8 (default: the model's)")
	fs.IntVar(&e.GPUsPerNode, "gpus-per-node", e.GPUsPerNode, "the twin's GPUs per NVLink domain (0: the GPU's)")
	fs.Float64Var(&e.ExpertZipf, "expert-zipf", e.ExpertZipf, "the twin's Zipf exponent of expert popularity (0: uniform; negative: the profile's)")
	fs.StringVar(&e.TwinCUDAGraph, "twin-cuda-graph", "rank", "the twin's CUDA graphs under attention DP: rank or fleet (TensorRT-LLM's rule; docs/twin.md)")
	fs.IntVar(&e.TwinCUDAGraphMaxBatch, "twin-cuda-graph-max-batch-size", 0, "with --twin-cuda-graph fleet: the largest captured batch (0: 128)")
	fs.BoolVar(&e.TwinMoEPadding, "twin-moe-dp-padding", false, "the twin pads every rank's MoE input to the largest rank's tokens (docs/twin.md)")
	fs.IntVar(&e.Ranks, "ranks", e.Ranks, "attention-DP ranks")
	fs.StringVar(&e.Trace, "trace", e.Trace, "Mooncake trace (required)")
	fs.IntVar(&e.Limit, "limit", e.Limit, "the first N requests of the trace (0 = all); bounds the evaluation's time")
	fs.StringVar(&e.Out, "out", e.Out, "report directory (required; created)")
	fs.IntVar(&e.MaxNumTokens, "max-num-tokens", e.MaxNumTokens, "token budget M per rank and iteration")
	fs.IntVar(&e.TokensPerPage, "tokens-per-page", e.TokensPerPage, "tokens per KV page")
	fs.IntVar(&e.MaxBatchSize, "max-batch-size", e.MaxBatchSize, "requests per rank and iteration")
	fs.IntVar(&e.MaxActive, "max-active-per-rank", e.MaxActive, "router cap of active requests per rank (the rest waits in the router)")
	fs.IntVar(&e.Demote, "demote-uncached", e.Demote, "configuration C: long-prefill demotion threshold U (uncached prompt tokens)")
	fs.IntVar(&e.LongPrefill, "long-prefill", e.LongPrefill, "requests whose uncached prompt is at least this many tokens are long prefills in the report; the others are short turns")
	sweep := fs.String("sweep", "0.1,0.2,0.3,0.5,0.7,0.9,1.1", "offered loads of the sweep, ascending multiples of each workload's measured capacity; G, H, I and K run at the highest")
	configs := fs.String("configs", strings.Join(e.Configs, ","), "configurations to run (ladder A,B,J,C,D at every load; E,F aggregated at every load; G,H,I,K,L aggregated at the highest)")
	fs.StringVar(&e.Arrivals, "arrivals", e.Arrivals, "arrival process of the twin runs: trace (the trace's own times, bursts included) or poisson (a Poisson process at its mean rate)")
	fs.DurationVar(&e.SLOTTFT, "slo-ttft", e.SLOTTFT, "goodput objective: time to first token")
	fs.DurationVar(&e.SLOTPOT, "slo-tpot", e.SLOTPOT, "goodput objective: mean time per output token after the first")
	fs.IntVar(&e.Jobs, "jobs", e.Jobs, "runs in flight at once (the twin's runs; the CPU engine's run one at a time)")
	fs.BoolVar(&e.CPU, "cpu", e.CPU, "also run configurations A–D on the CPU engine at small scale (real compute, wall clock)")
	fs.BoolVar(&jsonOut, "json", false, "print the summary as JSON on stdout (report.md and summary.json are written either way)")
	fs.StringVar(&e.LogLevel, "log-level", e.LogLevel, "log level of the runs (their logs go to OUT/logs/)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	e.Models, e.Configs = eval.ParseList(*models), eval.ParseList(*configs)
	var err error
	if e.Sweep, err = eval.ParseSweep(*sweep); err != nil {
		return err
	}
	if err := e.Validate(); err != nil {
		return err
	}
	ev, err := eval.Run(e, stderr)
	if err != nil {
		return err
	}
	if jsonOut {
		return ev.WriteSummary(stdout)
	}
	return nil
}
