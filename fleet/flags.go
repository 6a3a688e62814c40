package fleet

// The fleet's command line: every flag of `worker run` (and `worker serve`,
// which adds its own), and the parse that merges them with the config file
// and validates the result.

import (
	"errors"
	"flag"
	"io"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/internal/usage"
)

// AddFlags registers the fleet's flags on fs, bound to o (their defaults
// are o's values): `worker run`'s, which `worker serve` shares. After the
// parse, Complete applies what the flags cannot bind directly.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Engine, "engine", o.Engine, "engine backend: cpu (native CPU reference), cuda (GPU; device = local rank), "+
		"twin (digital twin: modelled GPU time on a virtual clock, docs/twin.md) or fake (pure Go, deterministic)")
	fs.StringVar(&o.GPU, "gpu", o.GPU, "with --engine twin: the GPU the twin models ("+strings.Join(twin.GPUNames(), ", ")+")")
	fs.StringVar(&o.CostProfile, "cost-profile", o.CostProfile, "with --engine twin: a cost profile file (JSON, docs/twin.md) instead of --gpu and --model")
	fs.IntVar(&o.TP, "tp", o.TP, "with --engine twin: tensor-parallel GPUs per attention-DP rank")
	fs.StringVar(&o.WeightDType, "weight-dtype", o.WeightDType, "with --engine twin: element type of the layers' weights, "+
		twin.DTypeNames+" (default: the model's own; fp8 runs the GEMMs at the FP8 rate)")
	fs.StringVar(&o.KVDType, "kv-dtype", o.KVDType, "with --engine twin: element type of the KV cache, "+twin.DTypeNames+
		" (default: the model's own; fp8 halves the KV bytes, doubling what fits)")
	fs.IntVar(&o.GPUsPerNode, "gpus-per-node", o.GPUsPerNode, "with --engine twin: GPUs per NVLink domain; larger TP or "+
		"expert-parallel groups send the rest over RDMA (0: the GPU's, 8 on HGX H100/H200/B200, 72 on GB300 NVL72)")
	fs.Float64Var(&o.ExpertZipf, "expert-zipf", o.ExpertZipf, "with --engine twin and an MoE model: Zipf exponent of "+
		"routed-expert popularity (0: uniform; negative: the profile's, uniform for the built-ins)")
	fs.StringVar(&o.TwinHostTime, "twin-host-time", o.TwinHostTime, "with --engine twin: the host time of a virtual iteration: "+
		"profile (the cost profile's host_overhead_ms) or measured (each rank's measured control-plane CPU time of the iteration; docs/twin.md)")
	fs.IntVar(&o.TwinThreads, "twin-threads", o.TwinThreads, "with --engine twin: OS threads that run the in-process ranks "+
		"between collectives (0: one per usable core for 16 ranks or more, at most one per 8 ranks; else 1); the results do not depend on it")
	fs.StringVar(&o.TwinCUDAGraph, "twin-cuda-graph", o.TwinCUDAGraph, "with --engine twin: when a pure-decode step replays its CUDA graph: "+
		"rank (whatever the other ranks run) or fleet (TensorRT-LLM under attention DP: only when every rank is generation-only, "+
		"each padded to the captured size above the largest rank's batch; docs/twin.md)")
	fs.IntVar(&o.TwinCUDAGraphMaxBatch, "twin-cuda-graph-max-batch-size", o.TwinCUDAGraphMaxBatch, "with --twin-cuda-graph fleet: "+
		"the largest captured batch (cuda_graph_config.max_batch_size; 0: 128)")
	fs.BoolVar(&o.TwinMoEPadding, "twin-moe-dp-padding", o.TwinMoEPadding, "with --engine twin and an MoE model: every rank pads "+
		"its MoE layers' input to the largest rank's tokens (TensorRT-LLM's use_dp_padding; docs/twin.md)")
	fs.StringVar(&o.CPUProfile, "cpuprofile", o.CPUProfile, "write a Go CPU profile of the run (of serve: until it exits) to this file (go tool pprof); "+
		"{rank} in the path is the process's rank, and without it a launch of several processes writes rank 0's only")
	fs.StringVar(&o.MemProfile, "memprofile", o.MemProfile, "write a Go allocation profile of the run (of serve: until it exits) to this file when it ends "+
		"(go tool pprof -sample_index=alloc_space, or inuse_space for the heap at the end); {rank} as for --cpuprofile")
	o.flagCostMode = o.CostModeName()
	fs.StringVar(&o.flagCostMode, "ctx-cost", o.flagCostMode, "where equal-cost chunking's kv_cost_offset and kv_depth_threshold come from: "+
		"off (scheduler.equal_cost or the TLLM_V2_CTX_COST_* variables), manual (scheduler.equal_cost only) or "+
		"auto (the online calibrator, docs/calibration.md)")
	fs.Float64Var(&o.GPUMemFraction, "gpu-mem-fraction", o.GPUMemFraction, "with --engine cuda and --pages 0: share of free GPU memory (after weights) for KV pages")
	fs.StringVar(&o.ChatTemplate, "chat-template", o.ChatTemplate, "a chat template (Jinja) to use instead of the checkpoint's: a file, or the template itself")
	fs.StringVar(&o.Model, "model", o.Model, "a checkpoint (GGUF file or Hugging Face directory) or a synthetic preset: "+strings.Join(bridge.PresetNames(), ", "))
	o.Text.flags(fs)
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the synthetic weights and token ids")
	fs.IntVar(&o.Ranks, "ranks", o.Ranks, "in-process attention-DP ranks")
	fs.IntVar(&o.Pages, "pages", o.Pages, "KV pages per rank (0 with --engine cuda: size from free GPU memory)")
	fs.IntVar(&o.TokensPerPage, "tokens-per-page", o.TokensPerPage, "tokens per KV page")
	fs.IntVar(&o.HostPages, "host-pages", o.HostPages, "host-tier KV pages per rank (0 = no host tier)")
	fs.IntVar(&o.MaxSeqLen, "max-seq-len", o.MaxSeqLen, "longest sequence in tokens (0 = the pool's size)")
	fs.StringVar(&o.CPUKernels, "cpu-kernels", o.CPUKernels, "the CPU engine's products: exact (float32, the reference) or quant (a checkpoint's Q8_0/Q4_0/Q4_1 projections in their blocks, its Q5 and K-quant ones converted to Q8_0 blocks, against 8-bit activations: faster and smaller, close to but not the exact tokens)")
	fs.IntVar(&o.CPUThreads, "cpu-threads", o.CPUThreads, "threads per rank of the CPU engine, 1-1024 (0 = the cores this process may use, shared by its ranks); every count gives the same tokens")
	fs.IntVar(&o.Scheduler.MaxBatchSize, "max-batch-size", o.Scheduler.MaxBatchSize, "requests per iteration per rank")
	fs.IntVar(&o.Scheduler.MaxNumTokens, "max-num-tokens", o.Scheduler.MaxNumTokens, "token budget per iteration per rank (0 = unlimited)")
	fs.IntVar(&o.Scheduler.ChunkUnitSize, "chunk-unit", o.Scheduler.ChunkUnitSize, "chunked-prefill granularity in tokens (0 = tokens per page)")
	fs.BoolVar(&o.Scheduler.ChunkedContext, "chunked-prefill", o.Scheduler.ChunkedContext, "split long prompts into chunks")
	o.flagPolicy = o.PolicyName()
	fs.StringVar(&o.flagPolicy, "policy", o.flagPolicy, "capacity policy: max_utilization or guaranteed_no_evict")
	fs.IntVar(&o.Scheduler.AdmissionLookahead, "admission-lookahead", o.Scheduler.AdmissionLookahead,
		"max_utilization: admit a new prompt only while the KV pool keeps pages for this many iterations of the running requests' growth (0 = off; docs/scheduling.md)")
	fs.StringVar(&o.Trace, "trace", o.Trace, "Mooncake JSON Lines trace (default: the built-in sample of 64 requests)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "serve at most N requests of the trace (0 = all)")
	fs.Float64Var(&o.LengthScale, "length-scale", o.LengthScale, "multiply input, output and block lengths by F (at least 1 token each)")
	fs.Float64Var(&o.ArrivalScale, "arrival-scale", o.ArrivalScale, "multiply trace arrival times by F (0 = every request arrives at once)")
	fs.StringVar(&o.Arrivals, "arrivals", o.Arrivals, "arrival process: trace (the trace's own times, bursts included) or poisson (a Poisson process at the trace's mean rate, seeded by --seed, same order)")
	fs.StringVar(&o.Report, "report", o.Report, "report format: text or json")
	fs.StringVar(&o.IterLog, "iter-log", o.IterLog, "per-rank iteration log, JSON Lines ({rank} is replaced by the rank; ranks from TLLM_PROFILE_LOG_RANKS)")
	fs.StringVar(&o.RequestsOut, "requests-out", o.RequestsOut, "write one JSON line per request to this file")
	fs.StringVar(&o.ConfigPath, "config", o.ConfigPath, "YAML config file (flags given on the command line override it)")
	fs.StringVar(&o.Progress, "progress", o.Progress, "progress display: auto, bar, lines or off")
	fs.DurationVar(&o.CollectiveTimeout, "collective-timeout", o.CollectiveTimeout, "collective watchdog timeout")
	fs.DurationVar(&o.IdlePoll, "idle-poll", o.IdlePoll, "under mpirun, how often the ranks of an idle fleet look for rank 0's next iteration, asleep in between "+
		"(the most it adds to the first iteration of a request; 0: they spin in MPI, a core each)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error")
	fs.StringVar(&o.Overlap, "overlap", o.Overlap, "overlap loop: on (schedule iteration N+1 while N runs) or off")
	fs.StringVar(&o.Router, "router", o.Router, "attention-DP router: default (load-balanced) or conversation (conversation-aware)")
	fs.BoolVar(&o.InferConversations, "infer-conversations", o.InferConversations, "infer conversation ids of a Mooncake trace from its hash_ids prefix chains")
	fs.BoolVar(&o.ContextOnly, "context-only", o.ContextOnly, "serve as a disaggregated context server: every request generates its first token only "+
		"(prefill, as the ranks the equal-cost calibration was designed on; docs/calibration.md)")
	fs.IntVar(&o.MaxActivePerRank, "max-active-per-rank", o.MaxActivePerRank, "hard cap of active requests per rank; the rest waits in the queue")
	fs.StringVar(&o.NewConvPlacement, "new-conv-placement", o.NewConvPlacement,
		"--router conversation: where a new conversation goes: round_robin, least_queued (fewest requests), least_tokens (fewest prompt tokens) "+
			"or least_prefill (fewest prompt tokens still to prefill)")
	fs.Float64Var(&o.LoadBalanceWeight, "load-balance-weight", o.LoadBalanceWeight,
		"--router conversation with least_tokens or least_prefill: a returning conversation goes to the rank minimising "+
			"weight x that rank's tokens + the prompt it must prefill there (home only has its uncached part); 0 = always home")
	fs.BoolVar(&o.ADPBalance.Enable, "attention-dp-balance", o.ADPBalance.Enable,
		"TensorRT-LLM's ADP Balance (attention_dp_config.enable_balance): hold contexts until every rank has one, then equilibrate (docs/multi-rank.md)")
	fs.BoolVar(&o.ADPBalance.CostLeveling, "attention-dp-cost-leveling", o.ADPBalance.CostLeveling,
		"cost leveling (attention_dp_config.enable_cost_leveling): a rank adds new prompts only up to the fleet's heaviest mandatory work (docs/multi-rank.md)")
	fs.IntVar(&o.ADPBalance.TimeoutIters, "attention-dp-timeout-iters", o.ADPBalance.TimeoutIters,
		"ADP Balance: iterations contexts wait at most for every rank to have one (attention_dp_config.timeout_iters)")
	fs.IntVar(&o.ADPBalance.BatchingWaitIters, "attention-dp-batching-wait-iters", o.ADPBalance.BatchingWaitIters,
		"ADP Balance: iterations of batch equilibration (attention_dp_config.batching_wait_iters)")
	fs.BoolVar(&o.NoPrefixReuse, "no-prefix-reuse", o.NoPrefixReuse, "turn radix-tree prefix reuse off")
	fs.StringVar(&o.KVEvents, "kv-events", o.KVEvents, "write the KV cache event stream (JSON Lines) to this file")
	fs.IntVar(&o.EventBufferMaxSize, "event-buffer-max-size", o.EventBufferMaxSize, "KV events each rank publishes per flush (older ones are dropped and counted)")
	fs.Func("kv-events-endpoint", "publish every attention-DP rank's KV cache events over ZeroMQ PUB in vLLM's format at this endpoint, "+
		"its port offset by the rank (bound with * or ::, connected to otherwise; docs/kv-events.md)", func(v string) error {
		o.KVEventsConfig.EnableKVCacheEvents, o.KVEventsConfig.Publisher, o.KVEventsConfig.Endpoint = true, "zmq", v
		return nil
	})
	fs.StringVar(&o.KVEventsConfig.ReplayEndpoint, "kv-events-replay-endpoint", o.KVEventsConfig.ReplayEndpoint,
		"ZeroMQ ROUTER endpoint answering replays of the KV event stream (bound; port offset by the rank)")
	fs.StringVar(&o.KVEventsConfig.Topic, "kv-events-topic", o.KVEventsConfig.Topic, "topic of the KV event messages")
	fs.IntVar(&o.CP, "cp", o.CP, "aggregated Helix context parallelism over this many in-process ranks (mutually exclusive with --ranks > 1)")
}

// ParseArgs reads `worker run`'s flags and config file and validates the
// result.
func ParseArgs(args []string, stderr io.Writer) (*Options, error) {
	o := Defaults()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return nil, usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.Complete(fs); err != nil {
		return nil, err
	}
	return &o, nil
}

// Complete finishes options parsed from fs: it applies the named settings
// the flags hold as text (--policy, --ctx-cost), merges the config file
// under the flags given on the command line and validates the result.
func (o *Options) Complete(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["policy"] {
		o.SetPolicy(o.flagPolicy)
	}
	if set["ctx-cost"] {
		o.SetCostMode(o.flagCostMode)
	}
	if err := o.MergeConfig(set); err != nil {
		return err
	}
	if o.CP > 1 && !o.Sources.RanksSet {
		o.Ranks = 1 // Helix replaces attention DP unless asked otherwise (then Validate refuses)
	}
	return o.Validate()
}
