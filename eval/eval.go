// Package eval is `worker eval`: the seed's workflow and its policies run
// side by side on the digital twin (and, small, on the CPU engine), written
// to a report directory (report.md, summary.json, PNG plots; docs/eval.md).
//
// Each run is the command line the report prints (and its environment):
// the evaluation parses it with the fleet's own parser, fleet.ParseArgs,
// and runs it with fleet.Run, so that every command in report.md reproduces
// its run exactly.
package eval

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/scheduler"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// `worker eval` runs the seed's workflow and its policies side by side and
// writes a report directory (issue 11; docs/eval.md):
//
//	A  token budget only (equal-cost off), iteration logs on every rank
//	B  equal-cost chunking with the (O, D) `worker calibrate` fits from A's logs
//	C  B + long-prefill demotion + the conversation-aware router
//	D  C with ctx_cost auto (the online calibrator) instead of the fitted values
//	E  A + ADP Balance (TensorRT-LLM's attention_dp_config), aggregated only
//	F  B + ADP Balance, aggregated only
//	G  C with least_tokens placement of new conversations, aggregated only
//
// on two workloads of the same trace: context servers (every request
// generates its first token only: the disaggregated prefill ranks the
// calibration was designed on, where A's logs come from) and aggregated
// serving (prefill and decode on the same ranks), each at a saturating load,
// and the aggregated one also at the trace's own pace.

// Options are the evaluation's settings (`worker eval`'s flags).
type Options struct {
	Engine string // the main evaluation's engine: twin
	GPU    string // the twin's GPU
	Model  string // the twin's model
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
	// Saturation is the saturated runs' offered prefill load, a multiple of
	// the fleet's measured context capacity.
	Saturation float64
	// CPU also runs configurations A–D on the CPU engine at small scale.
	CPU bool
}

// Defaults are the evaluation's defaults (the seed's scale).
func Defaults() Options {
	return Options{Engine: "twin", GPU: "h200", Model: "deepseek-v3", Ranks: 8, Limit: 3000, MaxNumTokens: 8192,
		TokensPerPage: 32, MaxBatchSize: 256, MaxActive: 256, Demote: 16384, LongPrefill: 16384, Saturation: 1.1,
		CPU: true, LogLevel: "warn", ExpertZipf: -1}
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
	case !(e.Saturation > 0):
		return usage.Errorf("--saturation must be positive, got %v", e.Saturation)
	}
	return nil
}

// evalRun is one run of the evaluation: its configuration, load and
// command line, and what came out.
type evalRun struct {
	Config   string   `json:"config"`   // A–I (or "capacity")
	Workload string   `json:"workload"` // context, aggregated
	Load     string   `json:"load"`     // trace, saturated, all-at-once
	Engine   string   `json:"engine"`
	Scale    float64  `json:"arrival_scale"`
	Command  string   `json:"command"`
	Env      []string `json:"env,omitempty"`

	Completed      int     `json:"completed"`
	WasteMean      float64 `json:"lockstep_waste_mean"`
	WasteP90       float64 `json:"lockstep_waste_p90"`
	PrefillTokPerS float64 `json:"prefill_tokens_per_s"` // prompt tokens computed
	// PromptTokPerS is every prompt token served (reused prefix included),
	// ReusedShare the reused share of the admitted prompt tokens.
	PromptTokPerS float64            `json:"prompt_tokens_per_s"`
	ReusedShare   float64            `json:"reused_share"`
	OutputTokPerS float64            `json:"output_tokens_per_s"`
	DurationS     float64            `json:"duration_s"`
	TTFTShort     report.Percentiles `json:"ttft_short_ms"`
	TTFTLong      report.Percentiles `json:"ttft_long_ms"`
	E2ELong       report.Percentiles `json:"e2e_long_ms"`
	TPOT          report.Percentiles `json:"tpot_ms"`
	ShortN, LongN int
	Preemptions   int     `json:"preemptions"`
	Offset        int64   `json:"kv_cost_offset"`
	Threshold     int64   `json:"kv_depth_threshold"`
	Published     bool    `json:"published,omitempty"` // D: the online calibrator published (O, D)
	WallS         float64 `json:"wall_s"`
	// The balance of the attention-DP ranks (report.Balance): token and
	// time balance ratios, the speed-of-light output throughput and the
	// iterations ADP Balance held the contexts (E, F).
	TokenBalance   float64 `json:"token_balance_ratio"`
	TimeBalance    float64 `json:"time_balance_ratio"`
	SOLOutputTokPS float64 `json:"sol_output_tokens_per_s"`
	ADPBalanceHeld int64   `json:"adp_balance_held_iterations,omitempty"`

	busy   [][]float32 // per forward iteration, per rank (ms)
	tokBal []float64   // per forward iteration with a token: mean/max of the ranks' tokens
	waste  []float64   // per forward iteration
	ttftS  []float64   // short requests' TTFT (ms)
	ttftL  []float64   // long prefills' TTFT (ms)
}

// Run runs the evaluation (progress lines on stderr) and writes its report
// directory.
func Run(e Options, stderr io.Writer) (*Evaluation, error) {
	for _, d := range []string{e.Out, filepath.Join(e.Out, "logs"), filepath.Join(e.Out, "iter")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("--out: %w", err)
		}
	}
	start := time.Now()
	ev := &Evaluation{opt: e, stderr: stderr}
	if err := ev.twin(); err != nil {
		return nil, err
	}
	if e.CPU {
		if err := ev.cpuCheck(); err != nil {
			return nil, err
		}
	}
	ev.wall = time.Since(start)
	if err := ev.write(); err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "worker eval: %d runs in %.0f s; report: %s\n", len(ev.runs), ev.wall.Seconds(), filepath.Join(e.Out, "report.md"))
	return ev, nil
}

// Evaluation is one `worker eval`: its runs and figures.
type Evaluation struct {
	opt    Options
	stderr io.Writer
	runs   []*evalRun
	wall   time.Duration

	capacity float64 // context capacity, prompt tokens/s served (context-only, everything at once): the demand's unit
	demand   float64 // the trace slice's prompt tokens per second at its own pace
	satScale float64 // arrival scale of the saturated runs
	fit      *fitOutcome
	cpuFit   *fitOutcome
	cpuNote  string
}

// fitOutcome is the calibration of A's logs: the result or why it failed.
type fitOutcome struct {
	result *costfit.Result
	err    error
	text   string // §8.3 output
	logs   string // the {rank} path fitted
}

// twin runs the evaluation on the twin.
func (ev *Evaluation) twin() error {
	e := ev.opt
	base := []string{"--engine", "twin", "--gpu", e.GPU, "--model", e.Model, "--pages", "0", "--ranks", strconv.Itoa(e.Ranks),
		"--trace", e.Trace, "--limit", strconv.Itoa(e.Limit), "--max-num-tokens", strconv.Itoa(e.MaxNumTokens),
		"--tokens-per-page", strconv.Itoa(e.TokensPerPage), "--max-batch-size", strconv.Itoa(e.MaxBatchSize),
		"--max-active-per-rank", strconv.Itoa(e.MaxActive)}
	base = append(base, e.deploymentArgs()...)
	// 1. The fleet's context capacity: context servers, everything at once.
	capRun, err := ev.run("capacity", "context", "all-at-once", append(slices.Clone(base), "--context-only", "--arrival-scale", "0"), nil, "")
	if err != nil {
		return err
	}
	ev.capacity = capRun.PromptTokPerS // whole prompts per second, as the demand counts them
	reqs, err := ev.traceDemand(base)
	if err != nil {
		return err
	}
	ev.demand = reqs
	if ev.capacity <= 0 || ev.demand <= 0 {
		return fmt.Errorf("eval: no context capacity (%.0f tokens/s) or demand (%.0f tokens/s) measured", ev.capacity, ev.demand)
	}
	ev.satScale = ev.demand / (ev.capacity * e.Saturation)
	sat := strconv.FormatFloat(ev.satScale, 'g', 4, 64)
	fmt.Fprintf(ev.stderr, "worker eval: context capacity %.0f prompt tokens/s served; the trace offers %.0f (load %.2f); saturated runs at --arrival-scale %s (load %.2f)\n",
		ev.capacity, ev.demand, ev.demand/ev.capacity, sat, e.Saturation)

	// 2. Context servers: A with iteration logs on every rank, then the fit.
	logs := filepath.Join(e.Out, "iter", "A-context.{rank}.jsonl")
	ctx := append(slices.Clone(base), "--context-only", "--arrival-scale", sat)
	if _, err := ev.run("A", "context", "saturated", ctx, nil, logs); err != nil {
		return err
	}
	ev.fit = ev.calibrate(logs, int64(e.MaxNumTokens), filepath.Join(e.Out, "calibration.png"))
	// 3. Every configuration on both workloads.
	for _, w := range []struct {
		workload, load string
		args           []string
	}{
		{"context", "saturated", ctx},
		{"aggregated", "trace", append(slices.Clone(base), "--arrival-scale", "1")},
		{"aggregated", "saturated", append(slices.Clone(base), "--arrival-scale", sat)},
	} {
		for _, c := range allConfigs {
			if c == "A" && w.workload == "context" {
				continue // ran above, with logs
			}
			if aggregatedOnly(c) && w.workload != "aggregated" {
				continue // ADP Balance, cost leveling and placement: aggregated serving only
			}
			args, env, ok := ev.configure(c, w.args, ev.fit)
			if !ok {
				continue
			}
			if _, err := ev.run(c, w.workload, w.load, args, env, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// deploymentArgs are the twin's deployment flags that differ from their
// defaults.
func (e *Options) deploymentArgs() []string {
	var a []string
	if e.WeightDType != "" {
		a = append(a, "--weight-dtype", e.WeightDType)
	}
	if e.KVDType != "" {
		a = append(a, "--kv-dtype", e.KVDType)
	}
	if e.GPUsPerNode != 0 {
		a = append(a, "--gpus-per-node", strconv.Itoa(e.GPUsPerNode))
	}
	if e.ExpertZipf >= 0 {
		a = append(a, "--expert-zipf", strconv.FormatFloat(e.ExpertZipf, 'g', -1, 64))
	}
	if e.TwinCUDAGraph != "" && e.TwinCUDAGraph != "rank" {
		a = append(a, "--twin-cuda-graph", e.TwinCUDAGraph)
	}
	if e.TwinCUDAGraphMaxBatch != 0 {
		a = append(a, "--twin-cuda-graph-max-batch-size", strconv.Itoa(e.TwinCUDAGraphMaxBatch))
	}
	if e.TwinMoEPadding {
		a = append(a, "--twin-moe-dp-padding")
	}
	return a
}

// aggregatedOnly are the configurations that run on aggregated serving
// only: ADP Balance (E, F), placement (G) and cost leveling (H, I) act where
// contexts and decodes share the ranks.
func aggregatedOnly(c string) bool { return strings.Contains("EFGHI", c) }

// configure adds configuration c's settings to args (and environment):
// B the fitted (O, D), C B + demotion + the conversation-aware router,
// D C with the online calibrator, E A + ADP Balance (TensorRT-LLM's
// attention_dp_config defaults), F B + ADP Balance, G C with least_tokens
// placement of new conversations, H A + cost leveling, I B + cost
// leveling, J B + the conversation-aware router (C without demotion: the
// ladder's step between B and C). ok is false when c needs a fit that
// failed.
func (ev *Evaluation) configure(c string, args []string, fit *fitOutcome) ([]string, []string, bool) {
	args = slices.Clone(args)
	var env []string
	switch c {
	case "A":
		return args, nil, true
	case "E":
		return append(args, "--attention-dp-balance"), nil, true
	case "F":
		args = append(args, "--attention-dp-balance")
	case "G":
		args = append(args, "--new-conv-placement", "least_tokens")
	case "H":
		return append(args, "--attention-dp-cost-leveling"), nil, true
	case "I":
		args = append(args, "--attention-dp-cost-leveling")
	}
	if c == "B" || c == "C" || c == "F" || c == "G" || c == "I" || c == "J" {
		if fit == nil || fit.err != nil {
			return nil, nil, false
		}
		env = []string{fmt.Sprintf("TLLM_V2_CTX_COST_KV_OFFSET=%d", fit.result.Offset),
			fmt.Sprintf("TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD=%d", fit.result.Threshold)}
	}
	if c == "C" || c == "D" || c == "G" {
		env = append(env, fmt.Sprintf("TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS=%d", ev.opt.Demote))
	}
	if c == "C" || c == "D" || c == "G" || c == "J" {
		args = append(args, "--router", "conversation", "--infer-conversations")
	}
	if c == "D" {
		args = append(args, "--ctx-cost", "auto")
	}
	return args, env, true
}

// traceDemand is the trace slice's prompt tokens per second at its own pace.
func (ev *Evaluation) traceDemand(base []string) (float64, error) {
	o, err := fleet.ParseArgs(append(slices.Clone(base), "--arrival-scale", "1"), ev.stderr)
	if err != nil {
		return 0, err
	}
	reqs, err := o.LoadWorkload(o.Ranks)
	if err != nil {
		return 0, err
	}
	var tokens float64
	var last time.Duration
	for i := range reqs {
		tokens += float64(reqs[i].Len())
		last = max(last, reqs[i].Arrival)
	}
	if last <= 0 {
		return 0, nil
	}
	return tokens / last.Seconds(), nil
}

// run executes one `worker run` in process with args (its environment: env
// only, plus TLLM_PROFILE_LOG_RANKS=all with iteration logs) and reduces
// its outcome.
func (ev *Evaluation) run(config, workloadName, load string, args, env []string, iterLog string) (*evalRun, error) {
	e := ev.opt
	name := fmt.Sprintf("%s-%s-%s-%s", config, workloadName, load, engineOf(args))
	args = append(args, "--progress", "off", "--log-level", e.LogLevel)
	if iterLog != "" {
		args = append(args, "--iter-log", iterLog)
		env = append(env, "TLLM_PROFILE_LOG_RANKS=all")
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	getenv := func(k string) string { return vars[k] }
	logf, err := os.Create(filepath.Join(e.Out, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	o, err := fleet.ParseArgs(args, logf)
	if err != nil {
		return nil, fmt.Errorf("eval run %s: %w", name, err)
	}
	o.RecordBusy = true
	fmt.Fprintf(ev.stderr, "worker eval: %s ...", name)
	t := time.Now()
	out, err := fleet.Run(o, logf, getenv)
	if err != nil {
		fmt.Fprintln(ev.stderr, " failed")
		return nil, fmt.Errorf("eval run %s (log %s): %w", name, logf.Name(), err)
	}
	fmt.Fprintf(ev.stderr, " %.1f s\n", time.Since(t).Seconds())
	r := &evalRun{Config: config, Workload: workloadName, Load: load, Engine: o.Engine, Env: env,
		Command: strings.Join(append(envPrefix(env), append([]string{"bin/worker", "run"}, quoteArgs(args)...)...), " ")}
	r.Scale = o.ArrivalScale
	ev.reduce(r, o, out)
	ev.runs = append(ev.runs, r)
	return r, nil
}

// reduce computes a run's figures from its outcome.
func (ev *Evaluation) reduce(r *evalRun, o *fleet.Options, out *fleet.Outcome) {
	rep := out.Report
	r.Completed, r.DurationS, r.WallS = rep.Requests.Completed, rep.DurationS, rep.WallS
	r.PrefillTokPerS, r.OutputTokPerS = rep.PrefillTokPerS, rep.OutputTokPerS
	r.PromptTokPerS, r.ReusedShare = rep.PromptTokPerS, rep.Prefix.HitRate
	r.Preemptions = rep.Preemptions.Suspended + rep.Preemptions.Recompute
	r.busy = out.Result.Rank0.Busy
	if b := rep.Balance; b != nil {
		r.TokenBalance, r.TimeBalance, r.SOLOutputTokPS, r.ADPBalanceHeld = b.TokenRatio, b.TimeRatio, b.SOLOutputTokPS, b.ADPBalanceHeld
	}
	for _, it := range out.Result.Rank0.Tokens {
		var sum, mx int32
		for _, t := range it {
			sum += t
			mx = max(mx, t)
		}
		if mx > 0 {
			r.tokBal = append(r.tokBal, float64(sum)/float64(len(it))/float64(mx))
		}
	}
	for _, it := range r.busy {
		var sum, mx float64
		for _, b := range it {
			sum += float64(b)
			mx = max(mx, float64(b))
		}
		if mx > 0 {
			r.waste = append(r.waste, 1-sum/float64(len(it))/mx)
		}
	}
	if len(r.waste) > 0 {
		var s float64
		for _, w := range r.waste {
			s += w
		}
		r.WasteMean = report.Round(s/float64(len(r.waste)), 4)
		sorted := slices.Clone(r.waste)
		slices.Sort(sorted)
		r.WasteP90 = report.Round(sorted[min(len(sorted)-1, int(math.Ceil(0.9*float64(len(sorted))))-1)], 4)
	}
	var e2eL, tpot []float64
	for i, resp := range report.ByIndex(len(out.Reqs), out.Result.Rank0.Responses) {
		if resp == nil || resp.Error != "" {
			continue
		}
		ttft := report.MSBetween(resp.ArrivalUnixNS, resp.FirstTokenUnixNS)
		if out.Reqs[i].Len()-resp.ReusedTokens >= ev.opt.LongPrefill {
			r.ttftL = append(r.ttftL, ttft)
			e2eL = append(e2eL, report.MSBetween(resp.ArrivalUnixNS, resp.FinishUnixNS))
		} else {
			r.ttftS = append(r.ttftS, ttft)
		}
		if len(resp.Output) > 1 {
			tpot = append(tpot, report.MSBetween(resp.FirstTokenUnixNS, resp.FinishUnixNS)/float64(len(resp.Output)-1))
		}
	}
	r.ShortN, r.LongN = len(r.ttftS), len(r.ttftL)
	r.TTFTShort, r.TTFTLong = report.Pct(slices.Clone(r.ttftS)), report.Pct(slices.Clone(r.ttftL))
	r.E2ELong, r.TPOT = report.Pct(e2eL), report.Pct(tpot)
	sc, _, _ := o.SchedulerConfig(func(k string) string {
		for _, kv := range r.Env {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v
			}
		}
		return ""
	})
	r.Offset, r.Threshold = sc.EqualCost.KVOffset, sc.EqualCost.KVDepthThreshold
	if o.Scheduler.CostMode == scheduler.CostAuto {
		r.Offset, r.Threshold, r.Published = 0, 0, false
		if p := lastPublication(out); p != nil {
			r.Offset, r.Threshold, r.Published = p.Offset, p.Threshold, true
		}
	}
}

// calibrate fits A's logs as `worker calibrate` does and writes its plot.
func (ev *Evaluation) calibrate(logs string, m int64, plotPath string) *fitOutcome {
	f := &fitOutcome{logs: logs}
	files, err := report.ExpandLogPaths([]string{logs})
	if err != nil {
		f.err = err
		return f
	}
	read, err := report.ReadCalibrationLogs(files)
	if err != nil {
		f.err = err
		return f
	}
	recs := read.Records
	opt := costfit.DefaultOptions()
	opt.MaxNumTokens = m
	if f.result, f.err = costfit.Fit(recs, opt); f.err != nil {
		return f
	}
	var b strings.Builder
	f.result.Format(&b) //nolint:errcheck // a strings.Builder does not fail
	f.text = b.String()
	if err := report.WriteCalibrationPlot(plotPath, f.result); err != nil {
		f.err = fmt.Errorf("calibration plot: %w", err)
	}
	return f
}

// cpuCheck runs A–D on the CPU engine at small scale: real compute, real
// time, two in-process ranks.
func (ev *Evaluation) cpuCheck() error {
	e := ev.opt
	base := []string{"--engine", "cpu", "--model", "tiny", "--ranks", "2", "--trace", e.Trace, "--limit", "160",
		"--length-scale", "0.05", "--max-num-tokens", "256", "--tokens-per-page", "16", "--max-batch-size", "32",
		"--arrival-scale", "0"}
	logs := filepath.Join(e.Out, "iter", "A-context-cpu.{rank}.jsonl")
	ctx := append(slices.Clone(base), "--context-only")
	if _, err := ev.run("A", "context", "all-at-once", ctx, nil, logs); err != nil {
		return err
	}
	ev.cpuFit = ev.calibrate(logs, 256, filepath.Join(e.Out, "calibration-cpu.png"))
	if ev.cpuFit.err != nil {
		ev.cpuNote = fmt.Sprintf("the CPU engine's logs gave no fit (%v): B and C are skipped on the CPU engine", ev.cpuFit.err)
	}
	for _, c := range []string{"A", "B", "C", "D"} {
		args, env, ok := ev.configure(c, base, ev.cpuFit)
		if !ok {
			continue
		}
		if c == "D" {
			// The CPU runs are short: refit often enough to publish.
			args = append(args, "--config", ev.cpuCalibConfig())
		}
		if _, err := ev.run(c, "aggregated", "all-at-once", args, env, ""); err != nil {
			return err
		}
	}
	return nil
}

// cpuCalibConfig writes the small-run calibrator settings of the CPU check.
func (ev *Evaluation) cpuCalibConfig() string {
	p := filepath.Join(ev.opt.Out, "logs", "cpu-ctx-cost.yaml")
	os.WriteFile(p, []byte("scheduler:\n  ctx_cost:\n    min_samples: 32\n    window: 256\n    refresh_interval: 32\n"), 0o644) //nolint:errcheck // the run reports a missing file
	return p
}

// engineOf is the --engine of args.
func engineOf(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--engine" {
			return args[i+1]
		}
	}
	return "cpu"
}

func envPrefix(env []string) []string { return slices.Clone(env) }

// quoteArgs quotes arguments a shell would split or expand.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " {}*?$'\"") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// WriteSummary prints every run's figures as JSON.
func (ev *Evaluation) WriteSummary(w io.Writer) error {
	s := struct {
		CapacityTokPerS float64    `json:"context_capacity_prompt_tokens_per_s"`
		DemandTokPerS   float64    `json:"trace_prompt_tokens_per_s"`
		TraceLoad       float64    `json:"trace_load"`
		SaturatedScale  float64    `json:"saturated_arrival_scale"`
		SaturatedLoad   float64    `json:"saturated_load"`
		Fit             any        `json:"fit,omitempty"`
		Runs            []*evalRun `json:"runs"`
		WallS           float64    `json:"wall_s"`
	}{ev.capacity, ev.demand, ev.demand / ev.capacity, ev.satScale, ev.opt.Saturation, nil, ev.runs, ev.wall.Seconds()}
	if ev.fit != nil && ev.fit.err == nil {
		s.Fit = ev.fit.result
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// lastPublication is the online calibrator's last publication of a run.
func lastPublication(out *fleet.Outcome) *costfit.Publication {
	p := out.Result.Rank0.CostPublications
	if len(p) == 0 {
		return nil
	}
	return &p[len(p)-1]
}
