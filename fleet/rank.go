package fleet

import (
	"fmt"
	"github.com/lockstep-ai/lockstep/serve/kvevents"
	"io"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// rankParts is one rank's components.
type rankParts struct {
	ex  *executor.Executor
	eng bridge.Engine
	kv  *kvpool.Manager
	pub *kvevents.Publisher // the rank's KV event publisher, or nil
}

func (r *rankParts) close() {
	if r.pub != nil {
		r.pub.Close() //nolint:errcheck // the run's own result matters more
	}
	if r.eng != nil {
		r.eng.Close()
	}
	if r.kv != nil {
		r.kv.Close()
	}
}

// world is the number of ranks of the run: attention-DP ranks, or Helix CP
// ranks (the two are mutually exclusive).
func (o *Options) world() int {
	if o.CP > 1 {
		return o.CP
	}
	return o.Ranks
}

// helixConfig is sc for a Helix run: the CP ranks' ledger blocks span
// tokens per page × cp tokens.
func (o *Options) helixConfig(sc scheduler.Config) scheduler.Config {
	if o.CP > 1 {
		sc.Helix = true
		sc.LedgerBlockTokens = o.TokensPerPage * o.CP
	}
	return sc
}

// rankSetup is what every rank of a run is built from: the options, the
// scheduler configuration, the Helix exchange group (nil without Helix),
// the log, the injected fault and the teardown it waits for, and the
// environment (getenv: the process's, or worker eval's private one).
type rankSetup struct {
	o       *Options
	sc      scheduler.Config
	cpGroup any
	log     *zap.Logger
	fault   *fault
	td      *teardown
	getenv  func(string) string
	// threadLocked: the ranks run as coroutines of one goroutine locked to
	// its OS thread (executor.Config.ThreadLocked).
	threadLocked bool
	// coroutines: the ranks are coroutines of one goroutine, which may not
	// run their loops on an engine's thread (executor.Config.EngineThread).
	coroutines bool
	// rankTagged: log already carries the rank (one rank per process);
	// in-process ranks share one logger and tag their lines (rankLog).
	rankTagged bool
}

// rankLog is rank i's logger: every line carries the rank once.
func (s *rankSetup) rankLog(i int) *zap.Logger {
	if s.rankTagged {
		return s.log
	}
	return s.log.With(zap.Int("rank", i))
}

// build builds rank i (on GPU device) of a world of o.world() ranks, with
// comm its control-plane communicator and iterLog, eventSink its outputs
// (nil: none). It runs no collective but the pool sizing of --pages 0.
func (s *rankSetup) build(i, device int, comm nccl.Comm, iterLog, eventSink io.Writer) (*rankParts, error) {
	ro, err := rankOptions(s.o, device, comm)
	if err != nil {
		return nil, err
	}
	if f := s.fault; f != nil && f.rank == i {
		f.hosted.Store(true)
		if f.kind == "init" {
			f.fired.Store(true)
			return nil, fmt.Errorf("rank %d: injected initialisation failure (%s)", i, FaultEnv)
		}
	}
	parts := &rankParts{}
	if parts.eng, err = ro.openRankEngine(i, device, s.cpGroup); err != nil {
		return nil, err
	}
	if parts.kv, err = kvpool.New(ro.poolConfig(i)); err != nil {
		parts.close()
		return nil, usage.Wrap(err)
	}
	cfg, planner, err := s.executorConfig(ro, i, parts, iterLog, eventSink)
	if err != nil {
		parts.close()
		return nil, err
	}
	// vLLM's publisher per data-parallel engine: every attention-DP rank
	// publishes its own events (ports offset by its rank); without
	// attention DP, rank 0 alone (the executor flushes there only).
	if ro.kvZMQ() && (i == 0 || (ro.CP <= 1 && ro.world() > 1)) {
		if parts.pub, err = kvevents.New(ro.kvPublisherConfig(i)); err != nil {
			parts.close()
			return nil, usage.Errorf("rank %d: %v", i, err)
		}
		cfg.EventPublisher = parts.pub
		s.rankLog(i).Info("KV events", zap.String("endpoint", parts.pub.Endpoint),
			zap.String("replay_endpoint", parts.pub.ReplayEndpoint), zap.String("topic", ro.KVEventsConfig.Topic))
	}
	parts.ex, err = executor.New(cfg, executor.Deps{Comm: comm, Engine: parts.eng, KV: parts.kv, Planner: planner})
	if err != nil {
		parts.close()
		return nil, err
	}
	return parts, nil
}

// openRankEngine opens rank i's engine.
func (o *Options) openRankEngine(i, device int, cpGroup any) (bridge.Engine, error) {
	ecfg := bridge.Config{Preset: o.Model, Seed: o.Seed, NumPages: o.Pages, TokensPerPage: o.TokensPerPage,
		NumHostPages: o.HostPages, DeviceID: device}
	if o.Engine == "cpu" {
		ecfg.CPUThreads, ecfg.CPUKernels = max(1, o.cpuThreads), o.CPUKernels
	}
	if o.loaded != nil {
		ecfg.Preset, ecfg.Shape, ecfg.Tensors = "", o.loaded.Shape, o.loaded.Tensors
	}
	if o.CP > 1 {
		ecfg.Helix = &bridge.HelixMember{Group: cpGroup, Rank: i, Size: o.CP}
	}
	if o.epGroup != nil {
		ecfg.Expert = &bridge.ExpertMember{Group: o.epGroup, Rank: i, Size: o.world()}
	}
	if o.Engine == "twin" {
		ecfg.Preset = "" // the profile's model (its name need not be a preset)
		return twin.New(ecfg, o.profile)
	}
	return openEngine(o.Engine, ecfg)
}

// MaxModelLen is the longest sequence a request may reach, prompt and
// output together (vLLM's max_model_len, reported by /v1/models and
// /tokenize): --max-seq-len when it is below the pool's size in (global)
// tokens, else that size.
func (o *Options) MaxModelLen() int {
	pool := o.Pages * o.TokensPerPage * o.CP
	if o.MaxSeqLen > 0 && o.MaxSeqLen < pool {
		return o.MaxSeqLen
	}
	return pool
}

// poolConfig is rank i's KV pool.
func (o *Options) poolConfig(i int) kvpool.Config {
	helix := o.CP > 1
	maxSeqLen := o.MaxSeqLen
	if maxSeqLen == 0 {
		maxSeqLen = o.Pages * o.TokensPerPage * o.CP // the pool's size in (global) tokens
	}
	kcfg := kvpool.Config{NumPages: o.Pages, TokensPerPage: o.TokensPerPage, HostPages: o.HostPages, MaxSeqLen: maxSeqLen,
		EnableBlockReuse: !o.NoPrefixReuse && !helix}
	if o.kvEventsOn() {
		kcfg.EventBufferMaxSize = o.EventBufferMaxSize
	}
	if helix {
		kcfg.CP, kcfg.CPRank = o.CP, i
	} else if o.world() > 1 {
		kcfg.AttentionDP, kcfg.AttentionDPRank = true, i
	}
	return kcfg
}

// executorConfig is rank i's executor configuration and planner: its
// scheduler and router, the outputs, the API hooks (rank 0 of serve), the
// calibrator, the schedule check, and the fault's planner where the fault
// lives.
func (s *rankSetup) executorConfig(o *Options, i int, parts *rankParts, iterLog, eventSink io.Writer) (executor.Config, executor.Planner, error) {
	sc, log := s.sc, s.log
	helix := o.CP > 1
	sch, err := scheduler.New(sc, parts.kv)
	if err != nil {
		return executor.Config{}, nil, usage.Wrap(err)
	}
	rt, err := router.New(o.Router, router.Config{MaxActivePerRank: o.MaxActivePerRank, NewConvPlacement: o.NewConvPlacement,
		LoadBalanceWeight: o.LoadBalanceWeight, Demotion: router.DemotionOn(sc.Demotion.UncachedTokens, sc.ChunkedContext)})
	if err != nil {
		return executor.Config{}, nil, usage.Wrap(err)
	}
	if i == 0 {
		log.Info("scheduler", zap.String("config", sch.Describe()))
		for _, n := range rt.Notes() {
			log.Info(n)
		}
	}
	cfg := executor.Config{Rank: i, Ranks: o.world(), Scheduler: sc, MaxSeqLen: o.MaxSeqLen, IterLog: iterLog,
		Overlap: o.Overlap == "on", Router: rt, StopTokens: o.stopTokens(), MaxActivePerRank: o.MaxActivePerRank, Helix: helix,
		Events: o.kvEventsOn(), EventSink: eventSink, EventBufferMaxSize: o.EventBufferMaxSize,
		OnNote: func(_ int, n scheduler.Note) { logNote(s.rankLog(i), n) }, MoE: o.moe() && o.Engine != "twin",
		RecordBusy: o.RecordBusy, ADPBalance: o.ADPBalance, IdlePoll: o.IdlePoll}
	if cfg.Guides, err = o.Guides(); err != nil {
		return executor.Config{}, nil, err
	}
	if o.Engine == "twin" {
		cfg.VirtualClock, cfg.VirtualEpoch = true, twinEpoch
		cfg.MeasuredHostTime = o.TwinHostTime == "measured"
	}
	cfg.ThreadLocked = s.threadLocked
	cfg.EngineThread = !s.coroutines // a native engine's calls without hand-offs
	if o.API != nil {
		cfg.Stream = true // every rank: the same gathers
		if i == 0 {
			o.API.Hooks(&cfg)
		}
	}
	if sc.CostMode == scheduler.CostAuto {
		set := o.Calibration.settings(int64(sc.MaxNumTokens))
		cfg.CostCalibration = &set
	}
	cfg.ScheduleCheck = s.scheduleCheck(i)
	var planner executor.Planner = sch
	if f := s.fault; f != nil && f.rank == i && f.kind != "init" {
		planner = newFaultyPlanner(sch, f, s.td.ch, parts.eng, 5*o.CollectiveTimeout)
	}
	return cfg, planner, nil
}

// scheduleCheck is whether rank i runs the Helix schedule check
// (TLLM_HELIX_AGG_CHECK_SCHEDULE, read through the run's getenv); rank 0
// logs why a setting has no effect.
func (s *rankSetup) scheduleCheck(i int) bool {
	o := s.o
	v := s.getenv(executor.ScheduleCheckEnv)
	if o.CP > 1 {
		on, warn := executor.ScheduleCheckGate(v, true, o.CP, 1)
		if warn != "" && i == 0 {
			s.log.Warn(warn)
		}
		return on
	}
	if _, warn := executor.ScheduleCheckGate(v, false, 1, 1); warn != "" && i == 0 {
		s.log.Warn(warn)
	}
	return false
}

// rankOptions is o for one rank: with --pages 0 (CUDA) the pool is sized
// from the rank's free GPU memory, the same on every rank.
func rankOptions(o *Options, device int, comm nccl.Comm) (*Options, error) {
	if o.Pages > 0 {
		return o, nil
	}
	n, err := poolPagesFromGPU(o, device, comm)
	if err != nil {
		return nil, err
	}
	ro := *o
	ro.Pages = n
	return &ro, nil
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
