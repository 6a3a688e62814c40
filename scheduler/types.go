package scheduler

// Unlimited is the value of Config.MaxNumTokens meaning "no token budget".
const Unlimited = -1

// Policy is the capacity policy (spec §14).
type Policy int

// Capacity policies.
const (
	MaxUtilization Policy = iota
	GuaranteedNoEvict
)

// String names the policy as the spec does.
func (p Policy) String() string {
	if p == GuaranteedNoEvict {
		return "GUARANTEED_NO_EVICT"
	}
	return "MAX_UTILIZATION"
}

// EqualCost holds the equal-cost chunking knobs (spec §9): O, D, R.
type EqualCost struct {
	KVOffset            int64 // O: TLLM_V2_CTX_COST_KV_OFFSET
	KVDepthThreshold    int64 // D: TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD
	PerChunkDepthTokens int64 // R: TLLM_V2_CTX_COST_PER_CHUNK_DEPTH_TOKENS
}

// Demotion holds the long-prefill demotion knobs (spec §10): U, K.
type Demotion struct {
	UncachedTokens int64 // U: TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS
	MaxIters       int64 // K: TLLM_V2_CTX_DEMOTE_MAX_ITERS
}

// Config is the scheduler configuration (spec §1).
type Config struct {
	MaxBatchSize      int // upper bound on requests per iteration
	SchedulerCapacity int // request budget; 0 means "= MaxBatchSize"
	MaxNumTokens      int // M; Unlimited for no token budget
	ChunkedContext    bool
	ChunkUnitSize     int // u ≥ 1
	Policy            Policy
	RecomputePause    bool
	PrefixAware       bool
	EqualCost         EqualCost
	Demotion          Demotion
	// LedgerBlockTokens is the bookkeeping unit used by PagesToCompletion:
	// tokens per page, or tokens per page × cp under Helix.
	LedgerBlockTokens int
	// Helix enables the aggregated-Helix variants (spec §13).
	Helix bool
	// AdmissionLookahead is W of the decode-growth admission watermark
	// (MAX_UTILIZATION only; 0 = off, the spec's behaviour): a first chunk
	// is admitted only if, once its pages are allocated, the pool still
	// holds a reserve of ceil((n+1)·W / ledger block) obtainable pages for
	// the growth over the next W iterations of the n requests already
	// past their first chunk, plus its own. Once one first chunk is
	// refused this way, no later first chunk is tried in the pass (FCFS),
	// and none preempts a running request. docs/scheduling.md.
	AdmissionLookahead int
	// CostMode says where O and D come from (spec §9.7). In CostAuto the cap
	// stays off until the calibrator calls Scheduler.PublishCost.
	CostMode CostMode
	// Names says how the caller's user knows each setting (a flag, a config
	// file key with its line, an environment variable), for errors and
	// notes; see Setting. ConfigFromEnv records the variables it applies.
	Names SettingNames
}

// CostMode is ctx_cost.mode (spec §9.7).
type CostMode int

// Cost modes.
const (
	// CostOff takes O, D and R from the environment (ConfigFromEnv).
	CostOff CostMode = iota
	// CostManual takes O, D and R from the ctx_cost section of the config
	// (R falls back to the environment).
	CostManual
	// CostAuto uses O and D published by the online calibrator.
	CostAuto
)

// String names the mode as the config does.
func (m CostMode) String() string {
	switch m {
	case CostOff:
		return "off"
	case CostManual:
		return "manual"
	case CostAuto:
		return "auto"
	}
	return "invalid"
}

// Level is the severity of a Note.
type Level int

// Note levels. The scheduler never logs; the caller maps these to its logger.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
)

// String names the level.
func (l Level) String() string {
	switch l {
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	}
	return "warn"
}

// Note is a log line the scheduler hands back as data instead of logging it
// (Helix sit-out debug lines, stall-detector debug and warning lines). Notes
// are produced only on rare events, so building their text does not cost
// anything in steady state.
type Note struct {
	Level Level
	Text  string
}

// Output is the record of one pass (spec §3). It is owned by the scheduler and
// valid until the next call to Schedule; callers copy what they keep.
type Output struct {
	Context         []*Request // scheduled context requests, ChunkSize set, sorted (§16)
	Generation      []*Request // scheduled generation requests, in scheduling order
	Paused          []*Request // suspended in this pass
	RecomputePaused []*Request // KV freed in this pass
	SatOut          []*Request // Helix: no page and no victim
	Deferred        []uint64   // deferred by the prefix-aware skip
	Demoted         []uint64   // demoted in this pass
	NumFitting      int        // len(Context) + len(Generation)
	StallCount      int        // stall counter after this pass
	CostUsed        int64      // equal-cost budget used in this pass (0 when off)
	CostBudget      int64      // B (0 when equal-cost chunking is off)
	// Charged is the per-context token charge in Context order.
	Charged []int
	// Notes are the log lines of this pass (see Note), in the order they arose.
	Notes []Note
}
