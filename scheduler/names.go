package scheduler

// Setting identifies one scheduler setting in error messages and notes.
//
// The scheduler's errors must name a value where the user set it: a flag, a
// FILE:LINE key of a config file, an environment variable or a key of a
// dry-run scenario. The scheduler cannot know which, so the caller says so
// in Config.Names; an empty name falls back to the spec's name (§1).
type Setting int

// Settings named in errors and notes.
const (
	SettingMaxBatchSize         Setting = iota // max_batch_size
	SettingSchedulerCapacity                   // scheduler_capacity
	SettingMaxNumTokens                        // max_num_tokens (M)
	SettingChunkedContext                      // enable_chunked_context
	SettingChunkUnitSize                       // chunk_unit_size (u)
	SettingPolicy                              // capacity_policy
	SettingRecomputePause                      // enable_recompute_pause
	SettingKVCostOffset                        // O
	SettingKVDepthThreshold                    // D
	SettingPerChunkDepthTokens                 // R
	SettingDemoteUncachedTokens                // U
	SettingDemoteMaxIters                      // K
	// SettingPoolSize is the KV pool's size, which the scheduler does not
	// configure but names when an allocation failure is fatal (§13).
	SettingPoolSize
	SettingAdmissionLookahead // admission_lookahead_iterations (W, docs/scheduling.md)
	numSettings
)

// SettingNames holds, per Setting, the name under which the caller's user
// set it ("--max-num-tokens", "cfg.yaml:7 scheduler.max_num_tokens",
// "TLLM_V2_CTX_COST_KV_OFFSET", "config.demotion.uncached_tokens"). An
// empty entry means the spec's name. It is an array so that Config stays
// comparable; it never affects a scheduling decision.
type SettingNames [numSettings]string

// specNames are the names of spec §1 (§9.7 for O and D in manual mode, §13
// for the pool size).
var specNames = SettingNames{
	SettingMaxBatchSize:         "max_batch_size",
	SettingSchedulerCapacity:    "scheduler_capacity",
	SettingMaxNumTokens:         "max_num_tokens",
	SettingChunkedContext:       "enable_chunked_context",
	SettingChunkUnitSize:        "chunk_unit_size",
	SettingPolicy:               "capacity_policy",
	SettingRecomputePause:       "enable_recompute_pause",
	SettingKVCostOffset:         EnvCostKVOffset,
	SettingKVDepthThreshold:     EnvCostKVDepthThreshold,
	SettingPerChunkDepthTokens:  EnvCostPerChunkDepthTokens,
	SettingDemoteUncachedTokens: EnvDemoteUncachedTokens,
	SettingDemoteMaxIters:       EnvDemoteMaxIters,
	SettingPoolSize:             "max_gpu_total_bytes (rank-local bytes) or max_tokens (global ledger tokens)",
	SettingAdmissionLookahead:   "admission_lookahead_iterations",
}

// Name returns the name of setting s for messages: the caller's name from
// c.Names, else the spec's. In ctx_cost manual mode O and D are the
// ctx_cost keys (§9.7).
func (c *Config) Name(s Setting) string {
	if s < 0 || s >= numSettings {
		return "unknown setting"
	}
	if n := c.Names[s]; n != "" {
		return n
	}
	if c.CostMode == CostManual {
		switch s {
		case SettingKVCostOffset:
			return "ctx_cost.kv_offset"
		case SettingKVDepthThreshold:
			return "ctx_cost.kv_depth_threshold"
		}
	}
	return specNames[s]
}
