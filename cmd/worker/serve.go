package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
	"github.com/lockstep-ai/lockstep/workload"
)

// serveOptions is everything `worker run` needs, after flags, the config file
// and the environment are merged.
type serveOptions struct {
	engine, model              string
	seed                       uint64
	ranks                      int
	pages, tokensPerPage       int
	hostPages, maxSeqLen       int
	maxBatchSize, maxNumTokens int
	chunkUnit                  int
	chunked                    bool
	policy                     string
	sched                      scheduler.Config // knobs only settable from the config file
	trace                      string
	limit                      int
	lengthScale, arrivalScale  float64
	report                     string
	iterLog, requestsOut       string
	configPath                 string
	progress                   string
	collectiveTimeout          time.Duration
	logLevel                   string
	overlap                    string
	routerName                 string
	inferConversations         bool
	contextOnly                bool // every request generates its first token only (a context server)
	maxActivePerRank           int
	cp                         int
	ranksSet                   bool // --ranks given explicitly
	pagesSet                   bool // --pages given (flag or config)
	noPrefixReuse              bool
	kvEvents                   string
	eventBufferMaxSize         int
	gpuMemFraction             float64
	gpu, costProfile           string        // --engine twin: built-in GPU, or a cost profile file
	tp                         int           // --engine twin: tensor-parallel GPUs per rank
	profile                    *twin.Profile // --engine twin: the cost profile (set by validate)
	ctxCost                    string        // --ctx-cost off | manual | auto
	calib                      calibSettings // scheduler.ctx_cost.* (auto mode)
	recordBusy                 bool          // keep per-iteration busy times (worker eval)

	// origin: flag name → the config file's "FILE:LINE key" for values
	// the file set (see src); reuseOnBy names what turned block reuse on
	// explicitly ("" when it is at its default).
	origin    map[string]string
	reuseOnBy string
	fault     *fault       // LOCKSTEP_TEST_FAULT, checked at startup
	out       *outputFiles // opened before any work

	text     promptOptions    // --prompt, --prompts, --chat, --max-tokens
	api      *apiServer       // worker serve: the HTTP API on rank 0 (nil for run)
	loaded   *model.Model     // --model PATH, opened by validate
	rendered []renderedPrompt // the tokenised prompts of a prompt run
	// epGroup is the expert-parallel group of a MoE run (openEPGroup), set
	// before the ranks are built; nil without expert parallelism.
	epGroup *nativeengine.CPGroup
}

func defaultServeOptions() serveOptions {
	return serveOptions{
		engine: "cpu", model: "tiny", seed: 1, ranks: 4,
		pages: 4096, tokensPerPage: 16, maxBatchSize: 64, maxNumTokens: 1024,
		chunked: true, policy: "max_utilization",
		sched:       scheduler.Config{RecomputePause: true, PrefixAware: true},
		lengthScale: 1, arrivalScale: 1, report: "text", progress: "auto",
		collectiveTimeout: 60 * time.Second, logLevel: "info", overlap: "on",
		routerName: "default", maxActivePerRank: 1024, cp: 1, eventBufferMaxSize: 1 << 20,
		gpuMemFraction: 0.9, gpu: "h200", tp: 1, ctxCost: "off", calib: defaultCalibSettings(),
	}
}

func (o *serveOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.engine, "engine", o.engine, "engine backend: cpu (native CPU reference), cuda (GPU; device = local rank), "+
		"twin (digital twin: modelled GPU time on a virtual clock, docs/twin.md) or fake (pure Go, deterministic)")
	fs.StringVar(&o.gpu, "gpu", o.gpu, "with --engine twin: the GPU the twin models ("+strings.Join(twin.GPUNames(), ", ")+")")
	fs.StringVar(&o.costProfile, "cost-profile", o.costProfile, "with --engine twin: a cost profile file (JSON, docs/twin.md) instead of --gpu and --model")
	fs.IntVar(&o.tp, "tp", o.tp, "with --engine twin: tensor-parallel GPUs per attention-DP rank")
	fs.StringVar(&o.ctxCost, "ctx-cost", o.ctxCost, "where equal-cost chunking's kv_cost_offset and kv_depth_threshold come from: "+
		"off (scheduler.equal_cost or the TLLM_V2_CTX_COST_* variables), manual (scheduler.equal_cost only) or "+
		"auto (the online calibrator, docs/calibration.md)")
	fs.Float64Var(&o.gpuMemFraction, "gpu-mem-fraction", o.gpuMemFraction, "with --engine cuda and --pages 0: share of free GPU memory (after weights) for KV pages")
	fs.StringVar(&o.model, "model", o.model, "a checkpoint (GGUF file or Hugging Face directory) or a synthetic preset: "+strings.Join(bridge.PresetNames(), ", "))
	o.text.flags(fs)
	fs.Uint64Var(&o.seed, "seed", o.seed, "seed of the synthetic weights and token ids")
	fs.IntVar(&o.ranks, "ranks", o.ranks, "in-process attention-DP ranks")
	fs.IntVar(&o.pages, "pages", o.pages, "KV pages per rank (0 with --engine cuda: size from free GPU memory)")
	fs.IntVar(&o.tokensPerPage, "tokens-per-page", o.tokensPerPage, "tokens per KV page")
	fs.IntVar(&o.hostPages, "host-pages", o.hostPages, "host-tier KV pages per rank (0 = no host tier)")
	fs.IntVar(&o.maxSeqLen, "max-seq-len", o.maxSeqLen, "longest sequence in tokens (0 = the pool's size)")
	fs.IntVar(&o.maxBatchSize, "max-batch-size", o.maxBatchSize, "requests per iteration per rank")
	fs.IntVar(&o.maxNumTokens, "max-num-tokens", o.maxNumTokens, "token budget per iteration per rank (0 = unlimited)")
	fs.IntVar(&o.chunkUnit, "chunk-unit", o.chunkUnit, "chunked-prefill granularity in tokens (0 = tokens per page)")
	fs.BoolVar(&o.chunked, "chunked-prefill", o.chunked, "split long prompts into chunks")
	fs.StringVar(&o.policy, "policy", o.policy, "capacity policy: max_utilization or guaranteed_no_evict")
	fs.StringVar(&o.trace, "trace", o.trace, "Mooncake JSON Lines trace (default: the built-in sample of 64 requests)")
	fs.IntVar(&o.limit, "limit", o.limit, "serve at most N requests of the trace (0 = all)")
	fs.Float64Var(&o.lengthScale, "length-scale", o.lengthScale, "multiply input, output and block lengths by F (at least 1 token each)")
	fs.Float64Var(&o.arrivalScale, "arrival-scale", o.arrivalScale, "multiply trace arrival times by F (0 = every request arrives at once)")
	fs.StringVar(&o.report, "report", o.report, "report format: text or json")
	fs.StringVar(&o.iterLog, "iter-log", o.iterLog, "per-rank iteration log, JSON Lines ({rank} is replaced by the rank; ranks from TLLM_PROFILE_LOG_RANKS)")
	fs.StringVar(&o.requestsOut, "requests-out", o.requestsOut, "write one JSON line per request to this file")
	fs.StringVar(&o.configPath, "config", o.configPath, "YAML config file (flags given on the command line override it)")
	fs.StringVar(&o.progress, "progress", o.progress, "progress display: auto, bar, lines or off")
	fs.DurationVar(&o.collectiveTimeout, "collective-timeout", o.collectiveTimeout, "collective watchdog timeout")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "log level: debug, info, warn or error")
	fs.StringVar(&o.overlap, "overlap", o.overlap, "overlap loop: on (schedule iteration N+1 while N runs) or off")
	fs.StringVar(&o.routerName, "router", o.routerName, "attention-DP router: default (load-balanced) or conversation (conversation-aware)")
	fs.BoolVar(&o.inferConversations, "infer-conversations", o.inferConversations, "infer conversation ids of a Mooncake trace from its hash_ids prefix chains")
	fs.BoolVar(&o.contextOnly, "context-only", o.contextOnly, "serve as a disaggregated context server: every request generates its first token only "+
		"(prefill, as the ranks the equal-cost calibration was designed on; docs/calibration.md)")
	fs.IntVar(&o.maxActivePerRank, "max-active-per-rank", o.maxActivePerRank, "router hard cap of active requests per rank")
	fs.BoolVar(&o.noPrefixReuse, "no-prefix-reuse", o.noPrefixReuse, "turn radix-tree prefix reuse off")
	fs.StringVar(&o.kvEvents, "kv-events", o.kvEvents, "write the KV cache event stream (JSON Lines) to this file")
	fs.IntVar(&o.eventBufferMaxSize, "event-buffer-max-size", o.eventBufferMaxSize, "KV events each rank publishes per flush (older ones are dropped and counted)")
	fs.IntVar(&o.cp, "cp", o.cp, "aggregated Helix context parallelism over this many in-process ranks (mutually exclusive with --ranks > 1)")
}

// validate refuses impossible configurations before any work starts.
// Errors name where each value came from (src): the flag, or the config
// file's FILE:LINE key.
func (o *serveOptions) validate() error {
	if err := usage.OneOf(o.src("engine"), o.engine, "cpu", "cuda", "twin", "fake"); err != nil {
		return err
	}
	if err := o.openModel(); err != nil {
		return err
	}
	if o.pages == 0 && o.engine != "cuda" && o.engine != "twin" {
		return usage.Errorf("%s must be at least 1 (0 sizes the pool from GPU memory and needs --engine cuda or twin)",
			o.src("pages"))
	}
	if !(o.gpuMemFraction > 0 && o.gpuMemFraction <= 1) {
		return usage.Errorf("%s must be in (0, 1], got %v", o.src("gpu-mem-fraction"), o.gpuMemFraction)
	}
	if err := o.validateTwin(); err != nil {
		return err
	}
	if err := o.validateCtxCost(); err != nil {
		return err
	}
	o.defaultCheckpointPages()
	if o.engine != "twin" && o.loaded == nil {
		if _, err := bridge.LookupPreset(o.model); err != nil {
			return usage.Errorf("%s: %v (or give a checkpoint path)", o.src("model"), err)
		}
	}
	if err := o.validatePrompts(); err != nil {
		return err
	}
	if err := usage.OneOf(o.src("report"), o.report, "text", "json"); err != nil {
		return err
	}
	if err := usage.OneOf(o.src("progress"), o.progress, "auto", "bar", "lines", "off"); err != nil {
		return err
	}
	if err := usage.OneOf(o.src("log-level"), o.logLevel, "debug", "info", "warn", "error"); err != nil {
		return err
	}
	if err := usage.OneOf(o.src("overlap"), o.overlap, "on", "off"); err != nil {
		return err
	}
	if _, err := parsePolicy(o.policy); err != nil {
		return usage.Errorf("%s: %v", o.src("policy"), err)
	}
	if err := usage.OneOf(o.src("router"), o.routerName, "default", "conversation"); err != nil {
		return err
	}
	if o.cp < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.src("cp"), o.cp)
	}
	if o.cp > 1 && o.ranks > 1 {
		return usage.Errorf("%s %d with %s %d: Helix and attention DP are mutually exclusive; use --ranks 1 with --cp",
			o.src("cp"), o.cp, o.src("ranks"), o.ranks)
	}
	if o.cp > 1 && o.hostPages > 0 {
		return usage.Errorf("%s %d with %s %d: aggregated Helix does not support a host cache tier",
			o.src("host-pages"), o.hostPages, o.src("cp"), o.cp)
	}
	if o.cp > 1 && o.engine != "cpu" {
		return usage.Errorf("%s %d needs --engine cpu (the %s engine of %s has no Helix attention)",
			o.src("cp"), o.cp, o.engine, o.src("engine"))
	}
	if o.eventBufferMaxSize < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.src("event-buffer-max-size"), o.eventBufferMaxSize)
	}
	if o.maxActivePerRank < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.src("max-active-per-rank"), o.maxActivePerRank)
	}
	positive := []struct {
		name string
		v    int
	}{{"ranks", o.ranks}, {"tokens-per-page", o.tokensPerPage}, {"max-batch-size", o.maxBatchSize}}
	for _, p := range positive {
		if p.v < 1 {
			return usage.Errorf("%s must be at least 1, got %d", o.src(p.name), p.v)
		}
	}
	nonNeg := []struct {
		name string
		v    int
	}{{"pages", o.pages}, {"host-pages", o.hostPages}, {"max-seq-len", o.maxSeqLen}, {"max-num-tokens", o.maxNumTokens},
		{"chunk-unit", o.chunkUnit}, {"limit", o.limit}}
	for _, p := range nonNeg {
		if p.v < 0 {
			return usage.Errorf("%s must be non-negative, got %d", o.src(p.name), p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"pages", o.pages}, {"host-pages", o.hostPages}} {
		if p.v > kvpool.MaxPages {
			return usage.Errorf("%s must be at most %d (int32 page indices), got %d", o.src(p.name), kvpool.MaxPages, p.v)
		}
	}
	if err := o.validateScales(); err != nil {
		return err
	}
	if o.collectiveTimeout <= 0 {
		return usage.Errorf("%s must be positive, got %v", o.src("collective-timeout"), o.collectiveTimeout)
	}
	return nil
}

// schedulerConfig builds the scheduler configuration (TLLM_* variables applied).
func (o *serveOptions) schedulerConfig(getenv func(string) string) (scheduler.Config, []string, error) {
	c := o.sched
	c.MaxBatchSize = o.maxBatchSize
	c.MaxNumTokens = o.maxNumTokens
	if o.maxNumTokens == 0 {
		c.MaxNumTokens = scheduler.Unlimited
	}
	c.ChunkedContext = o.chunked
	c.ChunkUnitSize = o.chunkUnit
	if c.ChunkUnitSize == 0 {
		c.ChunkUnitSize = o.tokensPerPage
	}
	c.Policy, _ = parsePolicy(o.policy)
	c.LedgerBlockTokens = o.tokensPerPage
	c.CostMode, _ = scheduler.ParseCostMode(o.ctxCost) // validated
	o.nameSchedulerSettings(&c)
	return scheduler.ConfigFromEnv(c, getenv)
}

// runServe is `worker run`.
func runServe(args []string, stdout, stderr io.Writer) error {
	o, err := parseRunOptions(args, stderr)
	if err != nil {
		return err
	}
	out, err := o.execute(stderr, os.Getenv)
	if err != nil || out == nil {
		return err // out == nil: not rank 0, which prints the report
	}
	// The report is printed even when an output failed: the results exist.
	if o.report == "json" {
		err = out.rep.WriteJSON(stdout)
	} else {
		if out.rep.Outputs != nil {
			err = report.WritePromptOutputs(stdout, out.rep.Outputs)
		}
		err = errors.Join(err, out.rep.WriteText(stdout))
	}
	if out.outErr != nil {
		return errors.Join(err, fmt.Errorf("the run finished (report printed) but an output is incomplete: %w", out.outErr))
	}
	if err != nil {
		return err
	}
	return out.rep.NothingServed()
}

// parseRunOptions reads `worker run`'s flags and config file and validates
// the result.
func parseRunOptions(args []string, stderr io.Writer) (*serveOptions, error) {
	o := defaultServeOptions()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return nil, usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := o.mergeConfig(set); err != nil {
		return nil, err
	}
	if o.cp > 1 && !o.ranksSet {
		o.ranks = 1 // Helix replaces attention DP unless asked otherwise (then validate refuses)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &o, nil
}

// runOutcome is a finished run as rank 0's process sees it: the report,
// the ranks' result, the workload, and the first error of an output file
// (the run itself succeeded).
type runOutcome struct {
	rep    *report.Report
	res    *serveResult
	reqs   []workload.Request
	outErr error
}

// execute runs validated options: scheduler configuration (getenv supplies
// the TLLM_* variables), startup checks, outputs, workload, the ranks, the
// report. It returns nil, nil on a process that is not rank 0.
func (o *serveOptions) execute(stderr io.Writer, getenv func(string) string) (*runOutcome, error) {
	log, err := newLogger(stderr, o.logLevel)
	if err != nil {
		return nil, err
	}
	defer log.Sync() //nolint:errcheck
	sc, notes, err := o.schedulerConfig(getenv)
	if err != nil {
		return nil, usage.Wrap(err)
	}
	launch, err := nccl.DetectLaunch(getenv)
	if err != nil {
		return nil, usage.Wrap(err)
	}
	more, err := o.startupChecks(sc, launch, getenv)
	if err != nil {
		return nil, err
	}
	for _, n := range append(notes, more...) {
		log.Info(n)
	}
	if o.loaded != nil {
		defer o.loaded.Close() //nolint:errcheck // read-only mapping
		log.Info("model", zap.String("path", o.loaded.Path), zap.String("name", o.loaded.Name),
			zap.String("format", o.loaded.Format), zap.Int64("weight_bytes", o.loaded.WeightBytes()),
			zap.Any("shape", o.loaded.Shape))
	}
	if o.out, err = o.openOutputs(launch, log, getenv); err != nil {
		return nil, err
	}
	defer o.out.close() //nolint:errcheck // closed again below, where its errors are reported
	reqs, err := o.loadWorkload(o.attentionDPRanks(launch))
	if err != nil {
		return nil, err
	}
	if err := o.checkServable(sc, reqs); err != nil {
		return nil, err
	}
	var res *serveResult
	if launch.MultiProcess() {
		res, err = serveProcess(o, sc, reqs, launch, log, stderr)
	} else {
		res, err = serve(o, sc, reqs, log, stderr)
	}
	if err != nil {
		return nil, err
	}
	if w := o.fault.unfiredWarning(); w != "" {
		log.Warn(w)
	}
	if res == nil {
		return nil, o.out.close() // not rank 0: rank 0 prints the report
	}
	rep := report.Build(o.runInfo(res), reqs, res.rank0)
	if w := o.out.requestsWriter(); w != nil {
		report.WriteRequests(w, reqs, res.rank0.Responses) //nolint:errcheck // an output keeps its first error for close
	}
	return &runOutcome{rep: rep, res: res, reqs: reqs, outErr: o.out.close()}, nil
}

// runInfo is what the report says about the run besides its requests.
func (o *serveOptions) runInfo(res *serveResult) report.RunInfo {
	info := report.RunInfo{Engine: o.engine, Model: o.model, Ranks: o.ranks, Wall: res.wall, DeviceMSPerRank: res.deviceMS,
		MoE: o.moe() && o.engine != "twin"}
	if o.loaded != nil {
		info.Model = o.loaded.Name
		if o.text.active() {
			info.Outputs = o.promptOutputs(res)
		}
	}
	if o.engine == "twin" {
		info.Model, info.VirtualEpoch = o.profile.Model.Name, twinEpoch
		if o.profile.Kind == twin.KindRoofline {
			info.GPU = o.profile.GPU.Name
		}
	}
	return info
}

// serveResult is what the ranks produced, as seen from rank 0.
type serveResult struct {
	rank0    *executor.Result
	wall     time.Duration
	deviceMS []float64 // per rank
}

// rankParts is one rank's components.
type rankParts struct {
	ex  *executor.Executor
	eng bridge.Engine
	kv  *kvpool.Manager
}

func (r *rankParts) close() {
	if r.eng != nil {
		r.eng.Close()
	}
	if r.kv != nil {
		r.kv.Close()
	}
}

// world is the number of ranks of the run: attention-DP ranks, or Helix CP
// ranks (the two are mutually exclusive).
func (o *serveOptions) world() int {
	if o.cp > 1 {
		return o.cp
	}
	return o.ranks
}

// buildRank builds rank i of a world of o.world() ranks. It runs no collective.
func buildRank(o *serveOptions, sc scheduler.Config, i, device int, comm nccl.Comm, cpGroup any,
	iterLog, eventSink io.Writer, log *zap.Logger, f *fault, td *teardown) (*rankParts, error) {
	parts := &rankParts{}
	if f != nil && f.rank == i {
		f.hosted.Store(true)
	}
	if f != nil && f.kind == "init" && f.rank == i {
		f.fired.Store(true)
		return nil, fmt.Errorf("rank %d: injected initialisation failure (%s)", i, FaultEnv)
	}
	helix := o.cp > 1
	ecfg := bridge.Config{Preset: o.model, Seed: o.seed, NumPages: o.pages, TokensPerPage: o.tokensPerPage,
		NumHostPages: o.hostPages, DeviceID: device}
	if o.loaded != nil {
		ecfg.Preset, ecfg.Shape, ecfg.Tensors = "", o.loaded.Shape, o.loaded.Tensors
	}
	if helix {
		ecfg.Helix = &bridge.HelixMember{Group: cpGroup, Rank: i, Size: o.cp}
	}
	if o.epGroup != nil {
		ecfg.Expert = &bridge.ExpertMember{Group: o.epGroup, Rank: i, Size: o.world()}
	}
	var err error
	if o.engine == "twin" {
		ecfg.Preset = "" // the profile's model (its name need not be a preset)
		parts.eng, err = twin.New(ecfg, o.profile)
	} else {
		parts.eng, err = openEngine(o.engine, ecfg)
	}
	if err != nil {
		return nil, err
	}
	maxSeqLen := o.maxSeqLen
	if maxSeqLen == 0 {
		maxSeqLen = o.pages * o.tokensPerPage * o.cp // the pool's size in (global) tokens
	}
	kcfg := kvpool.Config{NumPages: o.pages, TokensPerPage: o.tokensPerPage, HostPages: o.hostPages, MaxSeqLen: maxSeqLen,
		EnableBlockReuse: !o.noPrefixReuse && !helix}
	if o.kvEvents != "" {
		kcfg.EventBufferMaxSize = o.eventBufferMaxSize
	}
	if helix {
		kcfg.CP, kcfg.CPRank = o.cp, i
	} else if o.world() > 1 {
		kcfg.AttentionDP, kcfg.AttentionDPRank = true, i
	}
	if parts.kv, err = kvpool.New(kcfg); err != nil {
		parts.close()
		return nil, usage.Wrap(err)
	}
	sch, err := scheduler.New(sc, parts.kv)
	if err != nil {
		parts.close()
		return nil, usage.Wrap(err)
	}
	if i == 0 {
		log.Info("scheduler", zap.String("config", sch.Describe()))
	}
	rt, err := router.New(o.routerName, router.Config{MaxActivePerRank: o.maxActivePerRank,
		Demotion: router.DemotionOn(sc.Demotion.UncachedTokens, sc.ChunkedContext)})
	if err != nil {
		parts.close()
		return nil, usage.Wrap(err)
	}
	if i == 0 {
		for _, n := range rt.Notes() {
			log.Info(n)
		}
	}
	cfg := executor.Config{Rank: i, Ranks: o.world(), Scheduler: sc, MaxSeqLen: o.maxSeqLen, IterLog: iterLog,
		Overlap: o.overlap == "on", Router: rt, StopTokens: o.stopTokens(), MaxActivePerRank: o.maxActivePerRank, Helix: helix,
		Events: o.kvEvents != "", EventSink: eventSink, EventBufferMaxSize: o.eventBufferMaxSize,
		OnNote: func(rank int, n scheduler.Note) { logNote(log, rank, n) }, MoE: o.moe() && o.engine != "twin"}
	if o.engine == "twin" {
		cfg.VirtualClock, cfg.VirtualEpoch = true, twinEpoch
	}
	if o.api != nil {
		cfg.Stream = true // every rank: the same gathers
		if i == 0 {
			o.api.srv.Hooks(&cfg)
		}
	}
	cfg.RecordBusy = o.recordBusy
	if sc.CostMode == scheduler.CostAuto {
		set := o.calib.settings(int64(sc.MaxNumTokens))
		cfg.CostCalibration = &set
	}
	if helix {
		on, warn := executor.ScheduleCheckGate(os.Getenv(executor.ScheduleCheckEnv), true, o.cp, 1)
		cfg.ScheduleCheck = on
		if warn != "" && i == 0 {
			log.Warn(warn)
		}
	} else if _, warn := executor.ScheduleCheckGate(os.Getenv(executor.ScheduleCheckEnv), false, 1, 1); warn != "" && i == 0 {
		log.Warn(warn)
	}
	var planner executor.Planner = sch
	if f != nil && f.rank == i && f.kind != "init" {
		planner = &faultyPlanner{Planner: sch, f: f, teardown: td.ch, eng: parts.eng, stallFor: 5 * o.collectiveTimeout}
	}
	parts.ex, err = executor.New(cfg, executor.Deps{Comm: comm, Engine: parts.eng, KV: parts.kv, Planner: planner})
	if err != nil {
		parts.close()
		return nil, err
	}
	return parts, nil
}

// serve runs the ranks in-process over one local group and returns rank 0's
// result. Every rank is built before any runs, so a bad configuration fails
// before any collective; a failing rank closes its communicator so that its
// peers fail fast instead of waiting for the watchdog.
func serve(o *serveOptions, sc scheduler.Config, reqs []workload.Request, log *zap.Logger, stderr io.Writer) (*serveResult, error) {
	world := o.world()
	if o.cp > 1 {
		sc.Helix = true
		sc.LedgerBlockTokens = o.tokensPerPage * o.cp
	}
	// The twin's ranks run as coroutines of one goroutine (cheap
	// collectives for fleets of many ranks, deterministic); the other
	// engines' ranks each get a goroutine, as they would a process.
	var comms []nccl.Comm
	var coro *nccl.CoroGroup
	if o.engine == "twin" {
		coro = nccl.NewCoroGroup(world, false)
		for i := range world {
			comms = append(comms, coro.Member(i))
		}
	} else {
		for _, c := range nccl.NewLocalGroup(world, nccl.LocalOptions{Timeout: o.collectiveTimeout}) {
			comms = append(comms, c)
		}
	}
	if g, err := o.openEPGroup(world); err != nil {
		return nil, err
	} else if g != nil {
		defer g.Close()
		o.epGroup = g
	}
	var cpGroup any
	if o.cp > 1 {
		g, err := nativeengine.NewCPGroup(o.cp, o.collectiveTimeout)
		if err != nil {
			return nil, err
		}
		defer g.Close()
		cpGroup = g
	}
	flt := o.fault
	td := newTeardown()
	start := time.Now()
	prog := newProgress(stderr, o.progress, len(reqs))
	log.Info("serving", zap.Int("requests", len(reqs)), zap.Int("ranks", o.ranks), zap.Int("cp", o.cp),
		zap.String("engine", o.engine), zap.String("model", o.model), zap.String("router", o.routerName),
		zap.String("overlap", o.overlap))

	// Each rank builds its parts, votes on the outcome with every other rank
	// (so one failing rank makes all of them fail, before any loop
	// collective), then runs — as it would in a process of its own.
	results := make([]*executor.Result, world)
	errs := make([]error, world)
	runRank := func(i int) {
		{
			defer func() {
				if errs[i] != nil {
					td.fire()
					comms[i].Close() // wake peers blocked on this rank
				}
			}()
			ro, berr := rankOptions(o, i, comms[i])
			var parts *rankParts
			if berr == nil {
				parts, berr = buildRank(ro, sc, i, i, comms[i], cpGroup, o.out.iterLog(i), o.out.eventSink(i), log, flt, td)
			}
			status := executor.InitOK
			if berr != nil {
				status = executor.InitAbort
			}
			if _, errs[i] = executor.InitVote(comms[i], status, berr); errs[i] != nil {
				if parts != nil {
					parts.close()
				}
				return
			}
			defer parts.close()
			if i == 0 {
				// The replay starts once every rank is built (InitVote is
				// a collective): engine creation, e.g. converting a
				// checkpoint's weights, is not request latency.
				if o.api != nil {
					parts.ex.SetSource(o.api.srv.Source(), nil)
					o.api.srv.SetReady()
				} else {
					parts.ex.SetSource(executor.NewTraceSource(reqs, o.replayStart(time.Now())), prog.update)
				}
			}
			if cpGroup != nil {
				on := parts.ex.ScheduleCheck()
				if errs[i] = executor.AgreeScheduleCheck(comms[i], on); errs[i] != nil {
					return
				}
			}
			results[i], errs[i] = parts.ex.Run()
		}
	}
	if coro != nil {
		nccl.RunCoroutines(coro, func(i int, _ *nccl.CoroComm) error { runRank(i); return nil })
	} else {
		var wg sync.WaitGroup
		for i := 0; i < world; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runRank(i)
			}()
		}
		wg.Wait()
	}
	prog.done()
	for _, c := range comms {
		c.Close()
	}
	if err := firstRootCause(errs); err != nil {
		return nil, err
	}
	sr := &serveResult{rank0: results[0], wall: time.Since(start)}
	for _, r := range results {
		sr.deviceMS = append(sr.deviceMS, r.DeviceMS)
	}
	return sr, nil
}

// serveProcess runs this process's rank of a multi-process world (mpirun,
// srun, PMI or a torchrun-style launcher): one rank per process, the ranks
// meet through the process group's checked collectives under the watchdog.
// Rank 0 returns the result; the others return nil, nil.
func serveProcess(o *serveOptions, sc scheduler.Config, reqs []workload.Request, l nccl.Launch,
	log *zap.Logger, stderr io.Writer) (*serveResult, error) {
	if err := o.checkMultiProcessHelix(l); err != nil {
		return nil, err
	}
	if o.cp > 1 {
		sc.Helix = true
		sc.LedgerBlockTokens = o.tokensPerPage * o.cp
	} else {
		if o.ranks != 1 && o.ranks != l.WorldSize && o.ranksSet {
			return nil, usage.Errorf("%s %d does not match the %s launch of %d processes (one rank per process)",
				o.src("ranks"), o.ranks, l.Launcher, l.WorldSize)
		}
		o.ranks = l.WorldSize
	}
	log = log.With(zap.Int("rank", l.Rank))
	pg, err := nccl.OpenProcessGroup(l, nccl.GroupOptions{CollectiveTimeout: o.collectiveTimeout, OpenMPI: nativeengine.OpenMPI,
		NCCL: controlPlaneNCCL(o.engine, l.LocalRank, o.collectiveTimeout), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("rank %d: joining the %s world of %d: %w", l.Rank, l.Launcher, l.WorldSize, err)
	}
	// The Helix CP group, made before anything that can fail on one rank
	// only (its creation is collective; every rank that opened the process
	// group reaches it).
	var cpGroup any
	if o.cp > 1 {
		g, gerr := openProcessExchangeGroup(l, pg.Comm, o.collectiveTimeout, os.Getenv)
		if gerr != nil {
			pg.Close()
			return nil, fmt.Errorf("rank %d: opening the Helix CP exchange group: %w", l.Rank, gerr)
		}
		defer g.Close()
		cpGroup = g
	}
	// The expert-parallel group of a MoE model (EP and Helix exclude each
	// other), collective like the CP group's.
	if o.expertParallel(l.WorldSize) {
		g, gerr := openProcessExchangeGroup(l, pg.Comm, o.collectiveTimeout, os.Getenv)
		if gerr != nil {
			pg.Close()
			return nil, fmt.Errorf("rank %d: opening the expert-parallel exchange group: %w", l.Rank, gerr)
		}
		defer g.Close()
		o.epGroup = g
	}
	flt := o.fault
	td := newTeardown()
	ro, berr := rankOptions(o, l.LocalRank, pg.Comm)
	var parts *rankParts
	if berr == nil {
		parts, berr = buildRank(ro, sc, l.Rank, l.LocalRank, pg.Comm, cpGroup, o.out.iterLog(l.Rank), o.out.eventSink(l.Rank), log, flt, td)
	}
	status := executor.InitOK
	if berr != nil {
		status = executor.InitAbort
		// Said before the vote: once the others learn of the failure they
		// exit, and a launcher may tear this process down before its
		// final message.
		log.Error("initialisation failed", zap.Error(berr))
	}
	if _, err := executor.InitVote(pg.Comm, status, berr); err != nil {
		if parts != nil {
			parts.close()
		}
		return nil, exitAfterCollectiveError(pg, l, err)
	}
	defer parts.close()
	start := time.Now()
	if l.Rank == 0 {
		log.Info("serving", zap.Int("requests", len(reqs)), zap.Int("ranks", o.ranks), zap.Int("cp", o.cp), zap.String("launcher", string(l.Launcher)),
			zap.String("engine", o.engine), zap.String("model", o.model), zap.String("router", o.routerName),
			zap.String("overlap", o.overlap))
		if o.api != nil {
			parts.ex.SetSource(o.api.srv.Source(), nil)
			o.api.srv.SetReady()
		} else {
			prog := newProgress(stderr, o.progress, len(reqs))
			parts.ex.SetSource(executor.NewTraceSource(reqs, o.replayStart(start)), prog.update)
			defer prog.done()
		}
	}
	if cpGroup != nil {
		if err := executor.AgreeScheduleCheck(pg.Comm, parts.ex.ScheduleCheck()); err != nil {
			return nil, exitAfterCollectiveError(pg, l, err)
		}
	}
	res, err := parts.ex.Run()
	if err != nil {
		return nil, exitAfterCollectiveError(pg, l, err)
	}
	if err := pg.Close(); err != nil {
		return nil, err
	}
	if l.Rank != 0 {
		return nil, nil
	}
	return &serveResult{rank0: res, wall: time.Since(start), deviceMS: []float64{res.DeviceMS}}, nil
}

// checkMultiProcessHelix checks --cp under a multi-process launch: one CP
// rank per process, every process in one CP group (world = cp), and an MPI
// launch, since the per-layer exchange of attention partials runs over MPI.
func (o *serveOptions) checkMultiProcessHelix(l nccl.Launch) error {
	if o.cp <= 1 {
		return nil
	}
	if o.ranksSet && o.ranks != 1 {
		return usage.Errorf("%s %d with %s %d: attention DP together with Helix (world = dp x cp) is not supported; "+
			"launch exactly %d processes, one CP rank each, without %s", o.src("ranks"), o.ranks, o.src("cp"), o.cp, o.cp, o.src("ranks"))
	}
	if l.WorldSize != o.cp {
		if l.WorldSize%o.cp == 0 {
			return usage.Errorf("%s %d under a %s launch of %d processes: attention DP together with Helix "+
				"(%d DP groups of %d CP ranks) is not supported; launch exactly %d processes, one CP rank each",
				o.src("cp"), o.cp, l.Launcher, l.WorldSize, l.WorldSize/o.cp, o.cp, o.cp)
		}
		return usage.Errorf("%s %d under a %s launch of %d processes: Helix runs one CP rank per process; launch exactly %d processes",
			o.src("cp"), o.cp, l.Launcher, l.WorldSize, o.cp)
	}
	return nil
}

// ExchangeHostEnv overrides the address a process listens on and advertises
// for the engines' in-step exchanges over TCP (launches without MPI).
const ExchangeHostEnv = "LOCKSTEP_EXCHANGE_HOST"

// openProcessExchangeGroup opens the group over which this process's engine
// exchanges data inside its steps with the other processes (one member per
// process, ranked as the launch ranks them): MPI under an MPI launch, else a
// TCP mesh whose addresses and secret travel through comm (the control
// plane, authenticated). The TCP listener binds $LOCKSTEP_EXCHANGE_HOST, else
// 127.0.0.1 when every rank runs on this node, else this host's name.
func openProcessExchangeGroup(l nccl.Launch, comm nccl.Comm, timeout time.Duration,
	getenv func(string) string) (*nativeengine.CPGroup, error) {
	if l.UsesMPI() {
		g, err := nativeengine.NewMPICPGroup(0, timeout)
		if err != nil {
			return nil, err
		}
		if g.Size() != l.WorldSize || g.LocalRank() != l.Rank {
			g.Close()
			return nil, fmt.Errorf("the MPI exchange group places this process at rank %d of %d, the %s launch at rank %d of %d",
				g.LocalRank(), g.Size(), l.Launcher, l.Rank, l.WorldSize)
		}
		return g, nil
	}
	host := getenv(ExchangeHostEnv)
	if host == "" {
		if l.LocalSize == l.WorldSize || l.LocalSize == 0 {
			host = "127.0.0.1"
		} else if h, err := os.Hostname(); err == nil {
			host = h
		} else {
			return nil, fmt.Errorf("no host to listen on for the exchange group (%v); set %s", err, ExchangeHostEnv)
		}
	}
	var secret []byte
	if l.Rank == 0 {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
	}
	secret, err := comm.Broadcast("exchange_group_secret", 0, secret)
	if err != nil {
		return nil, err
	}
	return nativeengine.NewTCPCPGroup(l.Rank, l.WorldSize, host, secret, timeout, func(addr []byte) ([][]byte, error) {
		return comm.AllGather("exchange_group_addrs", addr)
	})
}

// exitAfterCollectiveError handles a failed multi-process rank. After a
// watchdog timeout a collective may still be blocked inside MPI and cannot
// be cancelled, so the group is not closed: the caller exits non-zero (and
// the launcher tears the other ranks down); rank 0 lingers a moment so that
// its peers can still read the watchdog reports from its store. Any other
// error (a mismatch, a schedule divergence, a failed init vote) leaves the
// ranks in step, so the group closes cleanly.
func exitAfterCollectiveError(pg *nccl.ProcessGroup, l nccl.Launch, err error) error {
	if !strings.HasPrefix(err.Error(), fmt.Sprintf("rank %d", l.Rank)) {
		err = fmt.Errorf("rank %d: %w", l.Rank, err)
	}
	// A timeout inside the engine's MoE exchanges leaves a peer's step
	// blocked in its own group the same way.
	if errors.Is(err, nccl.ErrTimeout) || errors.Is(err, bridge.ErrTimeout) {
		if l.Rank == 0 {
			time.Sleep(time.Second)
		}
		return err
	}
	pg.Close()
	return err
}

// rankOptions is o for one rank: with --pages 0 (CUDA) the pool is sized
// from the rank's free GPU memory, the same on every rank.
func rankOptions(o *serveOptions, device int, comm nccl.Comm) (*serveOptions, error) {
	if o.pages > 0 {
		return o, nil
	}
	n, err := poolPagesFromGPU(o, device, comm)
	if err != nil {
		return nil, err
	}
	ro := *o
	ro.pages = n
	return &ro, nil
}

// firstRootCause reports a failed run: the root cause first, then what
// every other rank saw. The root is the rank where the failure began: an
// error that is not a consequence of another rank's failure. A peer
// closing or the init vote relaying a failure elsewhere are consequences;
// so is a collective timeout when some rank failed for a reason of its own
// (a rank that stops entering collectives makes its peers time out before
// it is torn down and reports why). Only when every error is a consequence
// does the first timeout, then the first error, lead.
func firstRootCause(errs []error) error {
	root := -1
	for _, consequence := range []func(error) bool{
		func(err error) bool {
			// An engine's exchange group (Helix, MoE) times out or is
			// aborted when a peer stops: a consequence too.
			return errors.Is(err, nccl.ErrClosed) || errors.Is(err, executor.ErrInitFailedElsewhere) ||
				errors.Is(err, nccl.ErrTimeout) || errors.Is(err, bridge.ErrTimeout) || errors.Is(err, bridge.ErrCommError)
		},
		func(err error) bool { return !errors.Is(err, nccl.ErrTimeout) && !errors.Is(err, bridge.ErrTimeout) },
		func(error) bool { return false },
	} {
		for i, err := range errs {
			if err != nil && !consequence(err) {
				root = i
				break
			}
		}
		if root >= 0 {
			break
		}
	}
	if root < 0 {
		return nil
	}
	var others []string
	for i, err := range errs {
		if err != nil && i != root {
			others = append(others, fmt.Sprintf("rank %d: %v", i, err))
		}
	}
	if len(others) == 0 {
		return errs[root]
	}
	return fmt.Errorf("%w\nother ranks:\n  %s", errs[root], strings.Join(others, "\n  "))
}

func openEngine(engine string, cfg bridge.Config) (bridge.Engine, error) {
	switch engine {
	case "fake":
		return fake.New(cfg)
	case "cuda":
		cfg.Backend = "cuda"
		return nativeengine.Open(cfg)
	default:
		return nativeengine.Open(cfg)
	}
}

func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, usage.Errorf("--log-level: %v", err)
	}
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = "ts"
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.EncodeLevel = zapcore.CapitalLevelEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}

// logNote maps a scheduler log line to zap.
func logNote(log *zap.Logger, rank int, n scheduler.Note) {
	switch n.Level {
	case scheduler.LevelDebug:
		log.Debug(n.Text, zap.Int("rank", rank))
	case scheduler.LevelInfo:
		log.Info(n.Text, zap.Int("rank", rank))
	default:
		log.Warn(n.Text, zap.Int("rank", rank))
	}
}
