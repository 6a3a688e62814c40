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
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"

	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// `worker eval` runs the seed's workflow and its policies side by side and
// writes a report directory (issues 11 and 27; docs/eval.md). The
// configurations form a ladder, each step adding one thing:
//
//	A  token budget only (equal-cost off), iteration logs on every rank
//	B  A + equal-cost chunking with the (O, D) `worker calibrate` fits from A's logs
//	J  B + the conversation-aware router
//	C  J + long-prefill demotion
//	D  C with ctx_cost auto (the online calibrator) instead of the fitted values
//
// and, beside the ladder, aggregated serving only:
//
//	E  A + ADP Balance (TensorRT-LLM's attention_dp_config)
//	F  B + ADP Balance
//	G  C with least_tokens placement of new conversations
//	L  C with least_prefill placement of new conversations
//	H  A + cost leveling
//	I  B + cost leveling
//	K  E + cost leveling (ADP Balance and cost leveling together)
//
// on two workloads of the same trace: context servers (every request
// generates its first token only: the disaggregated prefill ranks the
// calibration was designed on, where A's logs come from) and aggregated
// serving (prefill and decode on the same ranks). Each workload's capacity
// is measured first (configuration A, every request at once); the ladder
// then runs at every point of a load sweep (multiples of that capacity),
// ADP Balance (E, F) at every point of aggregated serving's, and the other
// configurations beside it at the sweep's highest point.

// ladder are the configurations of the ladder, in order, with what each
// step adds; they run at every point of the sweep.
var ladder = []struct{ config, step string }{
	{"A", "token budget only"},
	{"B", "A + equal-cost chunking (offline fit)"},
	{"J", "B + conversation-aware router"},
	{"C", "J + long-prefill demotion"},
	{"D", "C with the online calibrator"},
}

// steps name what each configuration beside the ladder adds.
var steps = map[string]string{
	"E": "A + ADP Balance", "F": "B + ADP Balance", "G": "C + least_tokens placement",
	"L": "C + least_prefill placement",
	"H": "A + cost leveling", "I": "B + cost leveling", "K": "E + cost leveling",
}

// stepOf is what configuration c adds ("" for the capacity runs).
func stepOf(c string) string {
	for _, l := range ladder {
		if l.config == c {
			return l.step
		}
	}
	return steps[c]
}

// inLadder is whether c is one of the ladder's configurations.
func inLadder(c string) bool { return stepOf(c) != "" && steps[c] == "" }

// sweptBeside are the configurations beside the ladder that also run at
// every load of the sweep, on aggregated serving: ADP Balance (E, F), whose
// effect the latency and goodput curves show. Placement (G, L) and cost
// leveling (H, I, K) run at the highest load only: leveling changes nothing
// measurable there (docs/eval.md), and each sweep line costs about a
// sixth of the default evaluation's wall time.
const sweptBeside = "EF"

// runsAt is whether configuration c runs on workload w at load x of a sweep
// whose highest load is top: the ladder everywhere, the configurations
// beside it on aggregated serving only, ADP Balance at every load and the
// others at the highest.
func runsAt(c, w string, x, top float64) bool {
	switch {
	case inLadder(c):
		return true
	case w != "aggregated":
		return false
	case strings.Contains(sweptBeside, c):
		return true
	}
	return x == top
}

// evalRun is one run of the evaluation: its configuration, load and
// command line, and what came out.
type evalRun struct {
	Model    string   `json:"model"`
	Config   string   `json:"config"`           // A–L (or "capacity")
	Workload string   `json:"workload"`         // context, aggregated
	Load     string   `json:"load"`             // all-at-once, or the sweep point ("0.70×")
	LoadX    float64  `json:"load_x,omitempty"` // the sweep point: offered load / measured capacity
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
	PromptTokPerS float64 `json:"prompt_tokens_per_s"`
	ReusedShare   float64 `json:"reused_share"`
	OutputTokPerS float64 `json:"output_tokens_per_s"`
	DurationS     float64 `json:"duration_s"`
	// Requests per second: offered (the slice's requests over its scaled
	// arrival span), completed, and completed within the SLO (goodput).
	OfferedRPS    float64            `json:"offered_requests_per_s,omitempty"`
	ThroughputRPS float64            `json:"throughput_requests_per_s"`
	GoodputRPS    float64            `json:"goodput_requests_per_s"`
	SLOMet        int                `json:"slo_met"`
	TTFT          report.Percentiles `json:"ttft_ms"`
	E2E           report.Percentiles `json:"e2e_ms"`
	TTFTShort     report.Percentiles `json:"ttft_short_ms"`
	TTFTLong      report.Percentiles `json:"ttft_long_ms"`
	E2ELong       report.Percentiles `json:"e2e_long_ms"`
	TPOT          report.Percentiles `json:"tpot_ms"`
	ShortN, LongN int
	Preemptions   int   `json:"preemptions"`
	Offset        int64 `json:"kv_cost_offset"`
	Threshold     int64 `json:"kv_depth_threshold"`
	Published     bool  `json:"published,omitempty"` // D: the online calibrator published (O, D)
	// D: the iteration of the online calibrator's first publication, its
	// publications, and the run's forward iterations (does it settle?).
	FirstPublication int64   `json:"first_publication_iteration,omitempty"`
	Publications     int     `json:"publications,omitempty"`
	LastRefit        string  `json:"last_refit,omitempty"` // D: the calibrator's last refit ("published" or why not)
	Iterations       int     `json:"forward_iterations"`
	WallS            float64 `json:"wall_s"`
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
	if err := clearOutputs(e.Out); err != nil {
		return nil, err
	}
	start := time.Now()
	ev := &Evaluation{opt: e, stderr: stderr}
	// The CPU engine first: its timings are wall clock, in this process,
	// and the twin runs leave a heap of gigabytes whose collection would
	// take cores from the CPU ranks and scatter the samples its fit reads.
	if e.CPU {
		t := ev.phase("CPU engine")
		if err := ev.cpuCheck(); err != nil {
			return nil, err
		}
		t.done()
	}
	for _, m := range e.Models {
		if err := ev.twin(m); err != nil {
			return nil, err
		}
	}
	ev.wall = time.Since(start)
	t := time.Now()
	if err := ev.write(); err != nil {
		return nil, err
	}
	ev.phases = append(ev.phases, phase{Name: "report and plots", WallS: time.Since(t).Seconds()})
	fmt.Fprintf(stderr, "worker eval: %d runs in %.0f s (%d at once); report: %s\n", len(ev.runs), ev.wall.Seconds(), e.Jobs,
		filepath.Join(e.Out, "report.md"))
	ev.writeTime(stderr)
	return ev, nil
}

// outputs are the files an evaluation writes under its directory, as
// patterns: an earlier evaluation's are removed first, so a plot or log that
// this one does not write again (a fit that failed this time, a model or
// configuration not run) cannot sit beside its report as if it were its own.
// Nothing else in the directory is touched.
var outputs = []string{"report.md", "summary.json", "*-*.png", "logs/*.log", "logs/cpu-ctx-cost.yaml", "iter/A-context-*.jsonl"}

// clearOutputs removes an earlier evaluation's outputs from dir.
func clearOutputs(dir string) error {
	for _, pat := range outputs {
		names, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := os.Remove(n); err != nil {
				return fmt.Errorf("--out: an earlier evaluation's output: %w", err)
			}
		}
	}
	return nil
}

// Evaluation is one `worker eval`: its runs and figures.
type Evaluation struct {
	opt     Options
	stderr  io.Writer
	mu      sync.Mutex // guards runs and the progress lines
	runs    []*evalRun
	wall    time.Duration
	phases  []phase
	models  []*modelEval
	cpuFit  *fitOutcome
	cpuNote string
}

// modelEval is one model's capacities, demand and fit.
type modelEval struct {
	Model    string             `json:"model"`
	Capacity map[string]float64 `json:"capacity_prompt_tokens_per_s"` // per workload: A, every request at once, prompt tokens/s served
	Demand   float64            `json:"trace_prompt_tokens_per_s"`    // the slice at its own pace
	Requests int                `json:"requests"`
	SpanS    float64            `json:"trace_span_s"` // the slice's last arrival at its own pace
	// Instants are the slice's distinct arrival times and MaxBurst the
	// most requests arriving at one: scaling the arrivals stretches the
	// gaps between bursts, never a burst.
	Instants int `json:"arrival_instants"`
	MaxBurst int `json:"max_burst"`
	fit      *fitOutcome
}

// scale is the arrival scale that offers load x of workload w's capacity.
func (m *modelEval) scale(w string, x float64) float64 { return m.Demand / (m.Capacity[w] * x) }

// phase is where part of the evaluation's wall time went.
type phase struct {
	Name  string  `json:"name"`
	WallS float64 `json:"wall_s"`
	Runs  int     `json:"runs"`
	RunS  float64 `json:"run_s"` // the runs' own wall time, summed (more than WallS when runs overlap)
	start time.Time
	ev    *Evaluation
	first int
}

// phase starts timing one part of the evaluation.
func (ev *Evaluation) phase(name string) *phase {
	return &phase{Name: name, start: time.Now(), ev: ev, first: len(ev.runs)}
}

// done records the phase with the runs it added.
func (p *phase) done() {
	p.WallS = time.Since(p.start).Seconds()
	for _, r := range p.ev.runs[p.first:] {
		p.Runs++
		p.RunS += r.WallS
	}
	p.ev.phases = append(p.ev.phases, *p)
}

// writeTime prints where the evaluation's wall time went.
func (ev *Evaluation) writeTime(w io.Writer) {
	for _, p := range ev.phases {
		if p.Runs > 0 {
			fmt.Fprintf(w, "  %-40s %6.1f s wall, %3d runs, %6.1f s of run time\n", p.Name, p.WallS, p.Runs, p.RunS)
		} else {
			fmt.Fprintf(w, "  %-40s %6.1f s wall\n", p.Name, p.WallS)
		}
	}
}

// fitOutcome is the calibration of A's logs: the result or why it failed.
type fitOutcome struct {
	result *costfit.Result
	err    error
	text   string // §8.3 output
	logs   string // the {rank} path fitted
	plot   string // the calibration plot's file name
}

// job is one run to make.
type job struct {
	config, workload, load string
	x                      float64
	args, env              []string
	iterLog                string
}

// twin runs the evaluation of one model on the twin.
func (ev *Evaluation) twin(model string) error {
	e := ev.opt
	m := &modelEval{Model: model, Capacity: map[string]float64{}}
	ev.models = append(ev.models, m)
	base := []string{"--engine", "twin", "--gpu", e.GPU, "--model", model, "--pages", "0", "--ranks", strconv.Itoa(e.Ranks),
		"--trace", e.Trace, "--limit", strconv.Itoa(e.Limit), "--max-num-tokens", strconv.Itoa(e.MaxNumTokens),
		"--tokens-per-page", strconv.Itoa(e.TokensPerPage), "--max-batch-size", strconv.Itoa(e.MaxBatchSize),
		"--max-active-per-rank", strconv.Itoa(e.MaxActive)}
	base = append(base, e.deploymentArgs()...)
	if e.Arrivals != workload.ArrivalsTrace {
		base = append(base, "--arrivals", e.Arrivals)
	}
	workloads := []struct {
		name string
		args []string
	}{{"context", append(slices.Clone(base), "--context-only")}, {"aggregated", base}}

	// 1. Each workload's capacity: configuration A, every request at once.
	t := ev.phase(model + ": capacity")
	var jobs []job
	for _, w := range workloads {
		jobs = append(jobs, job{config: "capacity", workload: w.name, load: "all-at-once", args: append(slices.Clone(w.args), "--arrival-scale", "0")})
	}
	caps, err := ev.runAll(model, jobs, e.Jobs)
	if err != nil {
		return err
	}
	for i, w := range workloads {
		m.Capacity[w.name] = caps[i].PromptTokPerS
	}
	if err := ev.traceDemand(m, base); err != nil {
		return err
	}
	for _, w := range workloads {
		if m.Capacity[w.name] <= 0 || m.Demand <= 0 {
			return fmt.Errorf("eval %s: no %s capacity (%.0f prompt tokens/s) or demand (%.0f prompt tokens/s) measured", model, w.name, m.Capacity[w.name], m.Demand)
		}
		fmt.Fprintf(ev.stderr, "worker eval: %s %s capacity %.0f prompt tokens/s served; the trace offers %.0f at its own pace (load %.2f)\n",
			model, w.name, m.Capacity[w.name], m.Demand, m.Demand/m.Capacity[w.name])
	}
	t.done()

	// 2. A on context servers at the highest load with iteration logs on
	// every rank, then the fit B's step uses.
	t = ev.phase(model + ": A's logs and the fit")
	top := e.Sweep[len(e.Sweep)-1]
	logged := func(c, w string, x float64) bool { return c == "A" && w == "context" && x == top }
	logs := filepath.Join(e.Out, "iter", "A-context-"+model+".{rank}.jsonl")
	wantFit := slices.ContainsFunc(e.Configs, func(c string) bool { return c != "A" && c != "D" && c != "E" && c != "H" && c != "K" })
	if slices.Contains(e.Configs, "A") || wantFit {
		if _, err := ev.runAll(model, []job{ev.sweepJob(m, "A", "context", workloads[0].args, top, logs)}, 1); err != nil {
			return err
		}
		if wantFit {
			m.fit = ev.calibrate(logs, int64(e.MaxNumTokens), filepath.Join(e.Out, "calibration-"+model+".png"))
			if m.fit.err != nil {
				fmt.Fprintf(ev.stderr, "worker eval: %s: A's logs gave no fit (%v); the configurations that need it are skipped\n", model, m.fit.err)
			}
		}
	}
	t.done()

	// 3. The ladder at every point; beside it, on aggregated serving, ADP
	// Balance at every point and the others at the highest.
	t = ev.phase(model + ": the sweep")
	jobs = jobs[:0]
	for _, w := range workloads {
		for _, x := range e.Sweep {
			for _, c := range allConfigs {
				if !slices.Contains(e.Configs, c) || logged(c, w.name, x) {
					continue
				}
				if !runsAt(c, w.name, x, top) {
					continue
				}
				j := ev.sweepJob(m, c, w.name, w.args, x, "")
				var ok bool
				if j.args, j.env, ok = ev.configure(c, j.args, m.fit); ok {
					jobs = append(jobs, j)
				}
			}
		}
	}
	if _, err := ev.runAll(model, jobs, e.Jobs); err != nil {
		return err
	}
	t.done()
	return nil
}

// sweepJob is configuration c's run of workload w at load x.
func (ev *Evaluation) sweepJob(m *modelEval, c, w string, args []string, x float64, iterLog string) job {
	s := strconv.FormatFloat(m.scale(w, x), 'g', 4, 64)
	return job{config: c, workload: w, load: loadLabel(x), x: x, args: append(slices.Clone(args), "--arrival-scale", s), iterLog: iterLog}
}

// loadLabel names a sweep point.
func loadLabel(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) + "×" }

// runAll makes the jobs, Options.Jobs at a time, and records their runs in
// the jobs' order (the report does not depend on the order they finish in).
func (ev *Evaluation) runAll(model string, jobs []job, parallel int) ([]*evalRun, error) {
	out := make([]*evalRun, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = ev.run(model, j)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ev.runs = append(ev.runs, out...)
	return out, nil
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
// only: ADP Balance (E, F), placement (G, L) and cost leveling (H, I, K)
// act where contexts and decodes share the ranks.
func aggregatedOnly(c string) bool { return strings.Contains("EFGHIKL", c) }

// configure adds configuration c's settings to args (and environment):
// B the fitted (O, D), C B + demotion + the conversation-aware router,
// D C with the online calibrator, E A + ADP Balance (TensorRT-LLM's
// attention_dp_config defaults), F B + ADP Balance, G C with least_tokens
// placement of new conversations (L with least_prefill), H A + cost leveling, I B + cost
// leveling, K E + cost leveling, J B + the conversation-aware router (C without demotion: the
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
	case "L":
		args = append(args, "--new-conv-placement", "least_prefill")
	case "H":
		return append(args, "--attention-dp-cost-leveling"), nil, true
	case "I":
		args = append(args, "--attention-dp-cost-leveling")
	case "K":
		return append(args, "--attention-dp-balance", "--attention-dp-cost-leveling"), nil, true
	}
	if c == "B" || c == "C" || c == "F" || c == "G" || c == "I" || c == "J" || c == "L" {
		if fit == nil || fit.err != nil {
			return nil, nil, false
		}
		env = []string{fmt.Sprintf("TLLM_V2_CTX_COST_KV_OFFSET=%d", fit.result.Offset),
			fmt.Sprintf("TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD=%d", fit.result.Threshold)}
	}
	if c == "C" || c == "D" || c == "G" || c == "L" {
		env = append(env, fmt.Sprintf("TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS=%d", ev.opt.Demote))
	}
	if c == "C" || c == "D" || c == "G" || c == "J" || c == "L" {
		args = append(args, "--router", "conversation", "--infer-conversations")
	}
	if c == "D" {
		args = append(args, "--ctx-cost", "auto")
	}
	return args, env, true
}

// traceDemand measures the trace slice at its own pace: its prompt tokens
// per second, its requests and its arrival span.
func (ev *Evaluation) traceDemand(m *modelEval, base []string) error {
	o, err := fleet.ParseArgs(append(slices.Clone(base), "--arrival-scale", "1"), ev.stderr)
	if err != nil {
		return err
	}
	reqs, err := o.LoadWorkload(o.Ranks)
	if err != nil {
		return err
	}
	var tokens float64
	var last time.Duration
	at := map[time.Duration]int{}
	for i := range reqs {
		tokens += float64(reqs[i].Len())
		last = max(last, reqs[i].Arrival)
		at[reqs[i].Arrival]++
	}
	m.Requests, m.SpanS, m.Instants = len(reqs), last.Seconds(), len(at)
	for _, n := range at {
		m.MaxBurst = max(m.MaxBurst, n)
	}
	if last > 0 {
		m.Demand = tokens / last.Seconds()
	}
	return nil
}

// run executes one `worker run` in process with the job's args (its
// environment: the job's only, plus TLLM_PROFILE_LOG_RANKS=all with
// iteration logs) and reduces its outcome.
func (ev *Evaluation) run(model string, j job) (*evalRun, error) {
	e := ev.opt
	name := fmt.Sprintf("%s-%s-%s-%s-%s", model, j.config, j.workload, strings.TrimSuffix(j.load, "×"), engineOf(j.args))
	args := append(slices.Clone(j.args), "--progress", "off", "--log-level", e.LogLevel)
	env := slices.Clone(j.env)
	if j.iterLog != "" {
		args = append(args, "--iter-log", j.iterLog)
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
	t := time.Now()
	out, err := fleet.Run(o, logf, getenv)
	if err == nil {
		err = out.Report.Unanswered()
	}
	if err != nil {
		return nil, fmt.Errorf("eval run %s (log %s): %w", name, logf.Name(), err)
	}
	r := &evalRun{Model: model, Config: j.config, Workload: j.workload, Load: j.load, LoadX: j.x, Engine: o.Engine, Env: env,
		Command: strings.Join(append(slices.Clone(env), append([]string{"bin/worker", "run"}, quoteArgs(args)...)...), " ")}
	r.Scale = o.ArrivalScale
	ev.reduce(r, o, out)
	r.WallS = time.Since(t).Seconds()
	ev.mu.Lock()
	fmt.Fprintf(ev.stderr, "worker eval: %s %.1f s\n", name, r.WallS)
	ev.mu.Unlock()
	return r, nil
}

// reduce computes a run's figures from its outcome.
func (ev *Evaluation) reduce(r *evalRun, o *fleet.Options, out *fleet.Outcome) {
	rep := out.Report
	r.Completed, r.DurationS = rep.Requests.Completed, rep.DurationS
	r.PrefillTokPerS, r.OutputTokPerS = rep.PrefillTokPerS, rep.OutputTokPerS
	r.PromptTokPerS, r.ReusedShare = rep.PromptTokPerS, rep.Prefix.HitRate
	r.Preemptions = rep.Preemptions.Suspended + rep.Preemptions.Recompute
	r.busy = out.Result.Rank0.Busy
	r.Iterations = len(r.busy)
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
	var ttft, e2e, e2eL, tpot []float64
	sloTTFT, sloTPOT := float64(ev.opt.SLOTTFT)/1e6, float64(ev.opt.SLOTPOT)/1e6
	var last time.Duration
	for i, resp := range report.ByIndex(len(out.Reqs), out.Result.Rank0.Responses) {
		last = max(last, out.Reqs[i].Arrival)
		if resp == nil || resp.Error != "" {
			continue
		}
		first := report.MSBetween(resp.ArrivalUnixNS, resp.FirstTokenUnixNS)
		whole := report.MSBetween(resp.ArrivalUnixNS, resp.FinishUnixNS)
		ttft, e2e = append(ttft, first), append(e2e, whole)
		if out.Reqs[i].Len()-resp.ReusedTokens >= ev.opt.LongPrefill {
			r.ttftL = append(r.ttftL, first)
			e2eL = append(e2eL, whole)
		} else {
			r.ttftS = append(r.ttftS, first)
		}
		met := first <= sloTTFT
		if len(resp.Output) > 1 {
			per := report.MSBetween(resp.FirstTokenUnixNS, resp.FinishUnixNS) / float64(len(resp.Output)-1)
			tpot = append(tpot, per)
			met = met && per <= sloTPOT
		}
		if met {
			r.SLOMet++
		}
	}
	if r.LoadX > 0 && last > 0 {
		r.OfferedRPS = report.Round(float64(len(out.Reqs))/last.Seconds(), 4) // the arrivals are already scaled
	}
	if r.DurationS > 0 {
		r.ThroughputRPS = report.Round(float64(r.Completed)/r.DurationS, 4)
		r.GoodputRPS = report.Round(float64(r.SLOMet)/r.DurationS, 4)
	}
	r.ShortN, r.LongN = len(r.ttftS), len(r.ttftL)
	r.TTFT, r.E2E = report.Pct(ttft), report.Pct(e2e)
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
		pubs := out.Result.Rank0.CostPublications
		r.Publications, r.LastRefit = len(pubs), out.Result.Rank0.CostLastRefit
		if len(pubs) > 0 {
			p := pubs[len(pubs)-1]
			r.Offset, r.Threshold, r.Published, r.FirstPublication = p.Offset, p.Threshold, true, pubs[0].Iteration
		}
	}
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
	type modelSummary struct {
		*modelEval
		Fit      any    `json:"fit,omitempty"`
		FitError string `json:"fit_error,omitempty"`
		Knees    []knee `json:"knees"`
	}
	s := struct {
		SLOTTFTMS float64        `json:"slo_ttft_ms"`
		SLOTPOTMS float64        `json:"slo_tpot_ms"`
		Sweep     []float64      `json:"sweep_loads"`
		Models    []modelSummary `json:"models"`
		Runs      []*evalRun     `json:"runs"`
		Phases    []phase        `json:"time"`
		WallS     float64        `json:"wall_s"`
	}{SLOTTFTMS: float64(ev.opt.SLOTTFT) / 1e6, SLOTPOTMS: float64(ev.opt.SLOTPOT) / 1e6, Sweep: ev.opt.Sweep,
		Runs: ev.runs, Phases: ev.phases, WallS: ev.wall.Seconds()}
	for _, m := range ev.models {
		ms := modelSummary{modelEval: m, Knees: ev.knees(m.Model)}
		if m.fit != nil && m.fit.err == nil {
			ms.Fit = m.fit.result
		} else if m.fit != nil {
			ms.FitError = m.fit.err.Error()
		}
		s.Models = append(s.Models, ms)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
