package eval

import (
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/workload"
)

// Options are the evaluation's settings (`worker eval`'s flags).
type Options struct {
	Engine string   // the main evaluation's engine: twin
	GPU    string   // the twin's GPU
	Models []string // the twin's models, one section of the report each
	// The twin's deployment (as `worker run`'s flags of the same names):
	// element types ("" = the model's), GPUs per NVLink domain (0 = the
	// GPU's) and the Zipf exponent of expert popularity (< 0 = uniform).
	WeightDType, KVDType string
	GPUsPerNode          int
	ExpertZipf           float64
	// The twin's attention-DP coupling (`worker run`'s --twin-cuda-graph,
	// --twin-cuda-graph-max-batch-size, --twin-moe-dp-padding; docs/twin.md).
	TwinCUDAGraph         string
	TwinCUDAGraphMaxBatch int
	TwinMoEPadding        bool
	Trace                 string // the Mooncake trace (required)
	Out                   string // the report directory (required; created)
	LogLevel              string // the runs' log level (their logs go to Out/logs/)

	Ranks, Limit, MaxNumTokens, TokensPerPage int
	MaxBatchSize, MaxActive                   int
	// Demote is configuration C's demotion threshold U; LongPrefill splits
	// the report's requests into long prefills and short turns.
	Demote, LongPrefill int
	// Sweep are the offered loads, multiples of each workload's measured
	// capacity, ascending; the highest is the point where G, H, I and K run.
	Sweep []float64
	// Configs are the configurations run: the ladder's at every point, the
	// others on aggregated serving only, E and F at every point and G, H, I
	// and K at the highest.
	Configs []string
	// SLOTTFT and SLOTPOT are the goodput's service-level objective: a
	// request counts when its TTFT and its mean time per output token are
	// within them (TPOT only for requests with more than one output token).
	SLOTTFT, SLOTPOT time.Duration
	// Jobs are the runs in flight at once (each run is one goroutine-bound
	// twin fleet; the report does not depend on Jobs).
	Jobs int
	// CPU also runs configurations A–D on the CPU engine at small scale.
	CPU bool
	// Arrivals is the twin runs' arrival process (`worker run --arrivals`):
	// the trace's own times, bursts included, or a Poisson process at its
	// mean rate.
	Arrivals string
}

// DefaultConfigs are the configurations of a default evaluation: the
// ladder and the two balancing modes on A and B (G and L run with --configs).
var DefaultConfigs = []string{"A", "B", "J", "C", "D", "E", "F", "H", "I", "K"}

// Defaults are the evaluation's defaults (the seed's scale).
func Defaults() Options {
	return Options{Engine: "twin", GPU: "h200", Models: []string{"deepseek-v3", "llama-8b"}, Ranks: 8, Limit: 2000,
		MaxNumTokens: 8192, TokensPerPage: 32, MaxBatchSize: 256, MaxActive: 256, Demote: 16384, LongPrefill: 16384,
		Sweep: []float64{0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.1}, Configs: slices.Clone(DefaultConfigs),
		SLOTTFT: 10 * time.Second, SLOTPOT: 100 * time.Millisecond, Jobs: min(4, max(1, runtime.GOMAXPROCS(0))),
		CPU: true, LogLevel: "warn", ExpertZipf: -1, Arrivals: workload.ArrivalsTrace}
}

// Validate refuses settings the evaluation cannot run, before any work.
func (e *Options) Validate() error {
	switch {
	case e.Trace == "":
		return usage.Errorf("--trace is required (e.g. ../shared/data/mooncake/conversation_trace.jsonl)")
	case e.Out == "":
		return usage.Errorf("--out DIR is required")
	case e.Engine != "twin":
		return usage.Errorf("--engine %q: the evaluation runs on the twin (add --cpu for the CPU engine's small-scale check)", e.Engine)
	case len(e.Models) == 0:
		return usage.Errorf("--model: name at least one of the twin's models")
	case len(e.Sweep) == 0:
		return usage.Errorf("--sweep: give at least one load (multiples of the measured capacity, e.g. 0.3,0.5,0.7,0.9,1.1)")
	case len(e.Configs) == 0:
		return usage.Errorf("--configs: name at least one configuration")
	case e.SLOTTFT <= 0 || e.SLOTPOT <= 0:
		return usage.Errorf("--slo-ttft and --slo-tpot must be positive, got %v and %v", e.SLOTTFT, e.SLOTPOT)
	case e.Jobs < 1:
		return usage.Errorf("--jobs must be at least 1, got %d", e.Jobs)
	}
	if err := workload.CheckArrivals(e.Arrivals, "--arrivals"); err != nil {
		return usage.Wrap(err)
	}
	for i, x := range e.Sweep {
		if !(x > 0) || math.IsInf(x, 0) {
			return usage.Errorf("--sweep: load %v is not a positive multiple of the capacity", x)
		}
		if i > 0 && x <= e.Sweep[i-1] {
			return usage.Errorf("--sweep: the loads must ascend without repeats, got %v after %v", x, e.Sweep[i-1])
		}
	}
	seen := map[string]bool{}
	for _, c := range e.Configs {
		if stepOf(c) == "" {
			return usage.Errorf("--configs: unknown configuration %q (allowed: %s)", c, strings.Join(allConfigs, ","))
		}
		if seen[c] {
			return usage.Errorf("--configs: %s is named twice", c)
		}
		seen[c] = true
	}
	for _, m := range e.Models {
		if _, err := twin.BuiltinProfile(e.GPU, m, twin.Parallelism{}); err != nil {
			return usage.Errorf("--gpu %s --model %s: %v", e.GPU, m, err)
		}
	}
	// The trace's slice is read once here, so that a malformed one is
	// refused before the directory's earlier report is cleared.
	if _, err := workload.ReadFile(e.Trace, workload.Options{Limit: e.Limit, LengthScale: 1, VocabSize: 2,
		Ranks: e.Ranks}); err != nil {
		return usage.Errorf("--trace: %v", err)
	}
	return nil
}

// ParseList splits a comma-separated flag value, dropping blanks.
func ParseList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParseSweep parses --sweep's comma-separated loads.
func ParseSweep(v string) ([]float64, error) {
	var out []float64
	for _, s := range ParseList(v) {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, usage.Errorf("--sweep: %q is not a number (give loads as multiples of the capacity, e.g. 0.3,0.5,0.7,0.9,1.1)", s)
		}
		out = append(out, x)
	}
	return out, nil
}
