// Package fleet is one fleet of lockstep ranks as a library: the options of
// `worker run` and `worker serve` (one typed struct, its flags and its YAML
// config file), the checks that refuse an impossible configuration before
// any work, the launcher, process-group and exchange wiring, rank
// construction and engine opening, the outputs, fault injection and pool
// sizing. `worker run`, `worker serve` and `worker eval` call it.
//
// A run: Defaults, AddFlags and ParseArgs (or fill Options in code), then
// Validate, then Run. Run returns rank 0's outcome: the report, the ranks'
// result and the workload.
package fleet

import (
	"fmt"
	"strings"
	"time"

	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
	"github.com/lockstep-ai/lockstep/serve/kvevents"
	"github.com/lockstep-ai/lockstep/workload"
)

// Options is everything a fleet needs, after flags, the config file and
// the environment are merged. Each field's flag is named beside it; errors
// about a value name the flag, or the config file's "FILE:LINE key" that
// set it (Src).
type Options struct {
	Engine string // --engine: cpu, cuda, twin or fake
	Model  string // --model: a checkpoint path or a synthetic preset
	// ChatTemplate (--chat-template) replaces the checkpoint's chat
	// template: a file, or the template itself (vLLM's flag).
	ChatTemplate string
	Seed         uint64 // --seed
	Ranks        int    // --ranks: in-process attention-DP ranks
	CP           int    // --cp: aggregated Helix CP ranks (excludes Ranks > 1)

	Pages         int // --pages: KV pages per rank (0: sized from GPU memory, cuda and twin)
	TokensPerPage int // --tokens-per-page
	HostPages     int // --host-pages: host-tier pages per rank (0: none)
	MaxSeqLen     int // --max-seq-len (0: the pool's size)
	// CPUThreads (--cpu-threads) is how many threads each rank's CPU engine
	// runs a step on; 0: the cores this process may use, shared by the ranks
	// that compute on them (resolved by prepare into cpuThreads).
	CPUThreads int
	cpuThreads int
	// CPUKernels (--cpu-kernels): the CPU engine's products, exact or quant
	// (bridge.Config.CPUKernels).
	CPUKernels string

	// Scheduler holds every scheduler setting, from flags and the config
	// file alike. Two follow the flags' conventions until SchedulerConfig
	// resolves them: MaxNumTokens 0 is unlimited and ChunkUnitSize 0 the
	// page size. Policy and CostMode are set through SetPolicy and
	// SetCostMode, which keep an unknown name for Validate to refuse.
	Scheduler scheduler.Config
	// Calibration holds the online calibrator's settings
	// (scheduler.ctx_cost.* in the config file; ctx_cost auto).
	Calibration CalibSettings

	Trace              string  // --trace ("" and no prompts: the built-in sample)
	Limit              int     // --limit
	LengthScale        float64 // --length-scale
	ArrivalScale       float64 // --arrival-scale
	Arrivals           string  // --arrivals: workload.ArrivalsTrace or ArrivalsPoisson (at the trace's mean rate, seeded by Seed)
	InferConversations bool    // --infer-conversations
	ContextOnly        bool    // --context-only: every request generates its first token only
	Text               PromptOptions

	Report             string // --report: text or json (printed by the command)
	IterLog            string // --iter-log ({rank} replaced)
	RequestsOut        string // --requests-out
	KVEvents           string // --kv-events
	EventBufferMaxSize int    // --event-buffer-max-size
	// KVEventsConfig is vLLM's kv_events_config: the ZeroMQ publisher of
	// every attention-DP rank (docs/kv-events.md).
	KVEventsConfig KVEventsConfig
	ConfigPath     string // --config (read by MergeConfig)
	Progress       string // --progress: auto, bar, lines or off
	LogLevel       string // --log-level

	CollectiveTimeout time.Duration // --collective-timeout
	// IdlePoll (--idle-poll) is how often the ranks of an idle fleet under
	// mpirun look for rank 0's next iteration, asleep in between (0: they
	// spin in MPI's collective, a core each).
	IdlePoll         time.Duration
	Overlap          string // --overlap: on or off
	Router           string // --router: default or conversation
	MaxActivePerRank int    // --max-active-per-rank
	// NewConvPlacement (--new-conv-placement) is the conversation-aware
	// router's placement of a new conversation: round_robin, least_queued,
	// least_tokens or least_prefill.
	NewConvPlacement string
	// LoadBalanceWeight (--load-balance-weight) lets a returning
	// conversation leave its home for a rank whose weighted token load
	// plus the whole prompt costs less than home's plus the uncached part
	// (router.Config.LoadBalanceWeight); 0 keeps the spec's sticky rule.
	LoadBalanceWeight float64
	// ADPBalance is TensorRT-LLM's attention_dp_config (--attention-dp-balance,
	// --attention-dp-timeout-iters, --attention-dp-batching-wait-iters).
	ADPBalance     executor.ADPBalance
	NoPrefixReuse  bool    // --no-prefix-reuse
	GPUMemFraction float64 // --gpu-mem-fraction

	GPU         string  // --gpu (twin)
	CostProfile string  // --cost-profile (twin)
	TP          int     // --tp (twin)
	WeightDType string  // --weight-dtype (twin): bf16, fp8, nvfp4 or "" (the model's)
	KVDType     string  // --kv-dtype (twin): bf16, fp8 or "" (the model's)
	GPUsPerNode int     // --gpus-per-node (twin): GPUs per NVLink domain, 0 = the profile's
	ExpertZipf  float64 // --expert-zipf (twin): Zipf exponent of expert popularity, < 0 = the profile's
	// TwinHostTime (--twin-host-time): "profile", the virtual iterations'
	// host time is the cost profile's host_overhead_ms; "measured", each
	// rank's measured control-plane CPU time of the iteration.
	TwinHostTime string
	// TwinThreads (--twin-threads): OS threads that drive the twin's
	// in-process ranks (nccl.RunCoroutinesParallel); 0 picks one per
	// usable core for fleets of at least twinThreadsMinRanks ranks, else 1.
	// The results do not depend on it.
	TwinThreads int
	// The twin's attention-DP coupling (twin.AttentionDP, docs/twin.md):
	// TwinCUDAGraph (--twin-cuda-graph) "rank" or "fleet" (TensorRT-LLM's
	// rule: graphs only when every rank is generation-only, padded to the
	// largest batch); TwinCUDAGraphMaxBatch (--twin-cuda-graph-max-batch-size)
	// its largest captured batch, 0 = 128; TwinMoEPadding
	// (--twin-moe-dp-padding) MoE inputs padded to the largest rank's tokens.
	TwinCUDAGraph         string
	TwinCUDAGraphMaxBatch int
	TwinMoEPadding        bool
	// CPUProfile (--cpuprofile): write a Go CPU profile of the run here
	// (the command does, around the run or the server's life; go tool pprof
	// reads it). "{rank}" is the process's rank; without it, a launch of
	// several processes writes rank 0's alone.
	CPUProfile string
	// MemProfile (--memprofile): write a Go allocation profile (every
	// allocation of the run, sampled; pprof's alloc_space and alloc_objects,
	// and inuse_space after a final collection) here when the run ends.
	MemProfile string

	// RecordBusy keeps every forward iteration's per-rank busy times in
	// the result (worker eval's timeline and waste plots).
	RecordBusy bool

	// Sources says where values came from, for messages.
	Sources Sources

	// API is the HTTP API of `worker serve` on rank 0 (nil for run): the
	// fleet's request source instead of the workload.
	API RequestServer
	// GPUFreeMemory reads a GPU's free memory in bytes (NVML, injected by
	// the command; --pages 0 with --engine cuda). Nil: no GPU discovery.
	GPUFreeMemory func(device int) (uint64, error)

	badPolicy, badCostMode   string // names SetPolicy/SetCostMode refused
	flagPolicy, flagCostMode string // --policy and --ctx-cost as given (Complete applies them)

	profile  *twin.Profile    // --engine twin: the cost profile (set by Validate)
	loaded   *model.Model     // --model PATH, opened by Validate
	guides   *guideState      // structured outputs (Guides); set with loaded
	rendered []renderedPrompt // the tokenised prompts of a prompt run
	fault    *fault           // LOCKSTEP_TEST_FAULT, checked at startup
	out      *outputFiles     // opened before any work
	// epGroup is the expert-parallel group of a MoE run (openEPGroup), set
	// before the ranks are built; nil without expert parallelism.
	epGroup *nativeengine.CPGroup
}

// Sources records where settings came from.
type Sources struct {
	// Origin maps a flag name to the config file's "FILE:LINE key" for
	// values the file set.
	Origin map[string]string
	// RanksSet and PagesSet: the rank count and the pool size were given
	// (a flag or the file), not defaulted.
	RanksSet, PagesSet bool
	// ReuseOnBy names what turned block reuse on explicitly ("" when it
	// is at its default).
	ReuseOnBy string
}

// SetOrigin records that flag's value came from origin instead of the
// command line.
func (s *Sources) SetOrigin(flag, origin string) {
	if s.Origin == nil {
		s.Origin = map[string]string{}
	}
	s.Origin[flag] = origin
}

// RequestServer is the HTTP API of `worker serve`: rank 0's request source,
// the hooks that stream tokens back, and the signal that every rank is up.
type RequestServer interface {
	Source() executor.Source
	Hooks(cfg *executor.Config)
	SetReady()
	// PeerLost is told that a rank's process left the fleet (multi-process
	// runs: rank 0 learns it from the group's store at once).
	PeerLost(rank int)
}

// Defaults are the options with no flag and no config file.
func Defaults() Options {
	sc := scheduler.DefaultConfig()
	sc.MaxBatchSize, sc.MaxNumTokens, sc.ChunkedContext = 64, 1024, true
	return Options{
		Engine: "cpu", Model: "tiny", Seed: 1, Ranks: 4,
		Pages: 4096, TokensPerPage: 16, Scheduler: sc,
		LengthScale: 1, ArrivalScale: 1, Arrivals: workload.ArrivalsTrace, Report: "text", Progress: "auto",
		CollectiveTimeout: 60 * time.Second, IdlePoll: 500 * time.Microsecond, LogLevel: "info", Overlap: "on",
		Router: "default", MaxActivePerRank: 1024, NewConvPlacement: router.PlacementRoundRobin, ADPBalance: executor.DefaultADPBalance(), CP: 1, EventBufferMaxSize: 1 << 20,
		KVEventsConfig: KVEventsConfig{Publisher: "null", Endpoint: kvevents.DefaultEndpoint,
			BufferSteps: kvevents.DefaultBufferSteps, HWM: kvevents.DefaultHWM, Encoding: kvevents.EncodingArray},
		GPUMemFraction: 0.9, GPU: "h200", TP: 1, ExpertZipf: -1, TwinHostTime: "profile", TwinCUDAGraph: twin.GraphRank, Calibration: DefaultCalibSettings(),
		Text: PromptOptions{MaxTokens: 128, Logprobs: -1, PromptLogprobs: -1}, CPUKernels: "exact",
	}
}

// SetPolicy sets the capacity policy from its name (any case); an unknown
// name is kept for Validate, which refuses it naming where it came from.
func (o *Options) SetPolicy(name string) {
	p, err := parsePolicy(name)
	if err != nil {
		o.badPolicy = name
		return
	}
	o.Scheduler.Policy, o.badPolicy = p, ""
}

// PolicyName is the capacity policy as the flag spells it.
func (o *Options) PolicyName() string {
	if o.badPolicy != "" {
		return o.badPolicy
	}
	return strings.ToLower(o.Scheduler.Policy.String())
}

// SetCostMode sets where equal-cost chunking's O and D come from (--ctx-cost:
// off, manual or auto); an unknown name is kept for Validate.
func (o *Options) SetCostMode(name string) {
	m, err := scheduler.ParseCostMode(name)
	if err != nil {
		o.badCostMode = name
		return
	}
	o.Scheduler.CostMode, o.badCostMode = m, ""
}

// CostModeName is the ctx_cost mode as the flag spells it.
func (o *Options) CostModeName() string {
	if o.badCostMode != "" {
		return o.badCostMode
	}
	return o.Scheduler.CostMode.String()
}

// parsePolicy accepts the spec's names, case-insensitively.
func parsePolicy(s string) (scheduler.Policy, error) {
	switch strings.ToLower(s) {
	case "max_utilization":
		return scheduler.MaxUtilization, nil
	case "guaranteed_no_evict":
		return scheduler.GuaranteedNoEvict, nil
	}
	return 0, fmt.Errorf("capacity policy %q is not allowed (allowed: max_utilization, guaranteed_no_evict)", s)
}

// Src names where the value of flag's option came from, for messages: the
// config file's "FILE:LINE key", or "--flag" (given or default).
func (o *Options) Src(flag string) string {
	if s, ok := o.Sources.Origin[flag]; ok {
		return s
	}
	return "--" + flag
}

// Loaded is the checkpoint --model opened (nil for a preset); Validate
// opens it and Run closes it.
func (o *Options) Loaded() *model.Model { return o.loaded }

// KVEventsConfig is vLLM's kv_events_config (vllm/config/kv_events.py):
// with EnableKVCacheEvents and Publisher "zmq" every attention-DP rank
// publishes its KV cache events over ZeroMQ (serve/kvevents).
type KVEventsConfig struct {
	EnableKVCacheEvents bool   // enable_kv_cache_events
	Publisher           string // publisher: null or zmq
	Endpoint            string // endpoint (PUB; the port is offset by the DP rank)
	ReplayEndpoint      string // replay_endpoint (ROUTER); "" = none
	Topic               string // topic
	BufferSteps         int    // buffer_steps: batches kept for replay
	HWM                 int    // hwm: the PUB high-water mark
	Encoding            string // encoding: array (vLLM <= 0.11, llm-d, Dynamo) or map (later vLLM)
}

// kvZMQ reports whether the ranks publish KV events over ZeroMQ.
func (o *Options) kvZMQ() bool {
	return o.KVEventsConfig.EnableKVCacheEvents && o.KVEventsConfig.Publisher == "zmq"
}

// kvEventsOn reports whether the pools record KV events at all (a file, a
// publisher, or both).
func (o *Options) kvEventsOn() bool { return o.KVEvents != "" || o.kvZMQ() }

// kvPublisherConfig is rank dpRank's publisher.
func (o *Options) kvPublisherConfig(dpRank int) kvevents.Config {
	c := &o.KVEventsConfig
	return kvevents.Config{Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, Topic: c.Topic,
		BufferSteps: c.BufferSteps, HWM: c.HWM, DPRank: dpRank, Encoding: c.Encoding, BlockSize: o.TokensPerPage}
}
