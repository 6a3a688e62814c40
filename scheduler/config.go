package scheduler

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Environment variables read by ConfigFromEnv (spec §1).
const (
	EnvCostKVOffset            = "TLLM_V2_CTX_COST_KV_OFFSET"
	EnvCostKVDepthThreshold    = "TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD"
	EnvCostPerChunkDepthTokens = "TLLM_V2_CTX_COST_PER_CHUNK_DEPTH_TOKENS"
	EnvDemoteUncachedTokens    = "TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS"
	EnvDemoteMaxIters          = "TLLM_V2_CTX_DEMOTE_MAX_ITERS"
)

// MaxCostBudget bounds the equal-cost budget B: a configuration with
// B ≥ 2^62 is rejected so that the int64 ledger (used plus one floor chunk)
// cannot overflow.
const MaxCostBudget int64 = 1 << 62

// ErrConfig is wrapped by every configuration error of New, ConfigFromEnv and
// PublishCost.
var ErrConfig = errors.New("scheduler config")

// DefaultConfig returns the spec's defaults (§1): MAX_UTILIZATION, chunking
// off, recompute pause and prefix-aware scheduling on, everything else off.
// MaxBatchSize and MaxNumTokens are required settings and stay 0.
func DefaultConfig() Config {
	return Config{
		Policy:         MaxUtilization,
		RecomputePause: true,
		PrefixAware:    true,
	}
}

// ParsePolicy parses a capacity policy name, case-insensitively
// ("MAX_UTILIZATION", "guaranteed_no_evict"). Any other name is an error.
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "MAX_UTILIZATION":
		return MaxUtilization, nil
	case "GUARANTEED_NO_EVICT":
		return GuaranteedNoEvict, nil
	}
	return 0, fmt.Errorf("%w: capacity_policy %q is not MAX_UTILIZATION or GUARANTEED_NO_EVICT", ErrConfig, s)
}

// ParseCostMode parses ctx_cost.mode ("off", "manual", "auto"; case-insensitive).
func ParseCostMode(s string) (CostMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "off":
		return CostOff, nil
	case "manual":
		return CostManual, nil
	case "auto":
		return CostAuto, nil
	}
	return 0, fmt.Errorf("%w: ctx_cost.mode %q is not off, manual or auto", ErrConfig, s)
}

// settings are the effective values New derives from a Config.
type settings struct {
	maxTokens   int // M, or Unlimited
	maxRequests int // max_num_requests
	unit        int // u
	chunked     bool
	demotion    bool // U > 0 and chunking
	cost        costParams
}

// costParams is the equal-cost model of one pass (spec §9.2). on is false
// when the feature is off; the other fields are then meaningless.
type costParams struct {
	on              bool
	o, d, r, budget int64
	floor           int64 // F = max(u, M div 4)
}

// costBudget returns B = (O + D)·M + R·D, and false when it reaches 2^62
// (or overflows on the way).
func costBudget(o, d, r int64, m int) (int64, bool) {
	od, c1 := bits.Add64(uint64(o), uint64(d), 0)
	hi1, lo1 := bits.Mul64(od, uint64(m))
	hi2, lo2 := bits.Mul64(uint64(r), uint64(d))
	sum, c2 := bits.Add64(lo1, lo2, 0)
	if c1 != 0 || hi1 != 0 || hi2 != 0 || c2 != 0 || sum >= uint64(MaxCostBudget) {
		return 0, false
	}
	return int64(sum), true
}

// costEnabled reports the static enable conditions of §9.1 other than the
// source of O and D: M finite and chunking on.
func costEnabled(o, d int64, cfg *Config) bool {
	return o > 0 && d > 0 && cfg.MaxNumTokens != Unlimited && cfg.ChunkedContext
}

// newCostParams builds the cost model for O, D, R, or an error when B is too large.
func newCostParams(o, d, r int64, cfg *Config, unit int) (costParams, error) {
	if !costEnabled(o, d, cfg) {
		return costParams{}, nil
	}
	b, ok := costBudget(o, d, r, cfg.MaxNumTokens)
	if !ok {
		return costParams{}, fmt.Errorf("%w: equal-cost budget B = (O + D)·M + R·D must be below 2^62 "+
			"(O=%d, D=%d, R=%d, M=%d); lower the TLLM_V2_CTX_COST_* values or max_num_tokens",
			ErrConfig, o, d, r, cfg.MaxNumTokens)
	}
	floor := int64(cfg.MaxNumTokens / 4)
	if int64(unit) > floor {
		floor = int64(unit)
	}
	return costParams{on: true, o: o, d: d, r: r, budget: b, floor: floor}, nil
}

// validate checks cfg and derives the effective settings. Errors name the
// setting (config key or environment variable) and say what is allowed.
func validate(cfg *Config) (settings, error) {
	var st settings
	bad := func(name string, v any, want string) (settings, error) {
		return st, fmt.Errorf("%w: %s = %v, want %s", ErrConfig, name, v, want)
	}
	if cfg.MaxBatchSize < 0 {
		return bad("max_batch_size", cfg.MaxBatchSize, "≥ 0")
	}
	if cfg.SchedulerCapacity < 0 {
		return bad("scheduler_capacity", cfg.SchedulerCapacity, "≥ 0")
	}
	if cfg.MaxNumTokens < 0 && cfg.MaxNumTokens != Unlimited {
		return bad("max_num_tokens", cfg.MaxNumTokens, "≥ 0 or unlimited")
	}
	if cfg.LedgerBlockTokens < 0 {
		return bad("ledger block tokens", cfg.LedgerBlockTokens, "≥ 0")
	}
	if cfg.ChunkUnitSize < 0 {
		return bad("chunk_unit_size", cfg.ChunkUnitSize, "≥ 1")
	}
	if cfg.Policy != MaxUtilization && cfg.Policy != GuaranteedNoEvict {
		return bad("capacity_policy", int(cfg.Policy), "MAX_UTILIZATION or GUARANTEED_NO_EVICT")
	}
	if cfg.CostMode < CostOff || cfg.CostMode > CostAuto {
		return bad("ctx_cost.mode", int(cfg.CostMode), "off, manual or auto")
	}
	for _, v := range []struct {
		name string
		val  int64
	}{
		{EnvCostKVOffset, cfg.EqualCost.KVOffset},
		{EnvCostKVDepthThreshold, cfg.EqualCost.KVDepthThreshold},
		{EnvCostPerChunkDepthTokens, cfg.EqualCost.PerChunkDepthTokens},
		{EnvDemoteUncachedTokens, cfg.Demotion.UncachedTokens},
		{EnvDemoteMaxIters, cfg.Demotion.MaxIters},
	} {
		if v.val < 0 {
			return bad(v.name, v.val, "≥ 0")
		}
	}

	st.maxTokens = cfg.MaxNumTokens
	st.maxRequests = cfg.MaxBatchSize
	if cfg.SchedulerCapacity > 0 {
		st.maxRequests = cfg.SchedulerCapacity
	}
	// The chunk unit defaults to one (ledger) block and is otherwise taken
	// verbatim: 100 stays 100 with 64-token pages (T-CON-03).
	st.unit = cfg.ChunkUnitSize
	if st.unit == 0 {
		st.unit = cfg.LedgerBlockTokens
	}
	if st.unit < 1 {
		return bad("chunk_unit_size", cfg.ChunkUnitSize, "≥ 1 (or a ledger block size to default to)")
	}
	st.chunked = cfg.ChunkedContext
	st.demotion = cfg.Demotion.UncachedTokens > 0 && cfg.ChunkedContext
	if cfg.CostMode != CostAuto {
		c, err := newCostParams(cfg.EqualCost.KVOffset, cfg.EqualCost.KVDepthThreshold,
			cfg.EqualCost.PerChunkDepthTokens, cfg, st.unit)
		if err != nil {
			return st, err
		}
		st.cost = c
	}
	return st, nil
}

// ConfigFromEnv applies the five TLLM_V2_* variables (spec §1) over base and
// returns the resulting config, info notes for the caller to log, and an
// error naming the variable for a non-numeric or negative value or a cost
// budget B ≥ 2^62.
//
// Rules: unset or empty keeps base's value. With CostMode off the variables
// override base; with manual or auto, O and D come from base (the ctx_cost
// section) and the environment supplies R only where base has none (§9.7).
func ConfigFromEnv(base Config, getenv func(string) string) (Config, []string, error) {
	cfg := base
	var notes []string
	read := func(name string) (int64, bool, error) {
		raw := getenv(name)
		if raw == "" {
			return 0, false, nil
		}
		v, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %s=%q is not a base-10 integer", ErrConfig, name, raw)
		}
		if v < 0 {
			return 0, false, fmt.Errorf("%w: %s=%d is negative; use 0 for off", ErrConfig, name, v)
		}
		return v, true, nil
	}
	vals := [5]int64{}
	set := [5]bool{}
	for i, name := range []string{EnvCostKVOffset, EnvCostKVDepthThreshold, EnvCostPerChunkDepthTokens,
		EnvDemoteUncachedTokens, EnvDemoteMaxIters} {
		v, ok, err := read(name)
		if err != nil {
			return base, nil, err
		}
		vals[i], set[i] = v, ok
	}
	if cfg.CostMode == CostOff {
		if set[0] {
			cfg.EqualCost.KVOffset = vals[0]
		}
		if set[1] {
			cfg.EqualCost.KVDepthThreshold = vals[1]
		}
		if set[2] {
			cfg.EqualCost.PerChunkDepthTokens = vals[2]
		}
	} else {
		for i, name := range []string{EnvCostKVOffset, EnvCostKVDepthThreshold} {
			if set[i] {
				notes = append(notes, fmt.Sprintf("%s ignored: ctx_cost.mode is %s", name, cfg.CostMode))
			}
		}
		if set[2] && cfg.EqualCost.PerChunkDepthTokens == 0 {
			cfg.EqualCost.PerChunkDepthTokens = vals[2]
		}
	}
	if set[3] {
		cfg.Demotion.UncachedTokens = vals[3]
	}
	if set[4] {
		cfg.Demotion.MaxIters = vals[4]
	}

	if cfg.CostMode != CostAuto {
		o, d := cfg.EqualCost.KVOffset, cfg.EqualCost.KVDepthThreshold
		oName, dName := EnvCostKVOffset, EnvCostKVDepthThreshold
		if cfg.CostMode == CostManual {
			oName, dName = "ctx_cost.kv_offset", "ctx_cost.kv_depth_threshold"
		}
		switch {
		case o > 0 && d == 0:
			notes = append(notes, "equal-cost cap stays off: "+dName+" is 0")
		case d > 0 && o == 0:
			notes = append(notes, "equal-cost cap stays off: "+oName+" is 0")
		case o > 0 && d > 0 && cfg.MaxNumTokens == Unlimited:
			notes = append(notes, "equal-cost cap stays off: max_num_tokens is unlimited")
		case o > 0 && d > 0 && !cfg.ChunkedContext:
			notes = append(notes, "equal-cost cap stays off: enable_chunked_context is false")
		}
	}
	if cfg.Demotion.UncachedTokens > 0 && !cfg.ChunkedContext {
		notes = append(notes, "long-prefill demotion stays off: enable_chunked_context is false")
	}
	if cfg.Demotion.MaxIters > 0 && cfg.Demotion.UncachedTokens == 0 {
		notes = append(notes, EnvDemoteMaxIters+" has no effect: "+EnvDemoteUncachedTokens+" is 0")
	}
	if _, err := validate(&cfg); err != nil {
		return base, nil, err
	}
	return cfg, notes, nil
}

// Describe returns the one startup info line listing what is on (spec §1):
// capacity policy, chunking and unit, equal-cost (O, D, R, B) or off,
// demotion (U, K) or off, recompute pause, prefix-aware scheduling.
func (s *Scheduler) Describe() string {
	var b strings.Builder
	b.WriteString("scheduler: policy=")
	b.WriteString(s.cfg.Policy.String())
	fmt.Fprintf(&b, " max_num_requests=%d", s.st.maxRequests)
	if s.st.maxTokens == Unlimited {
		b.WriteString(" max_num_tokens=unlimited")
	} else {
		fmt.Fprintf(&b, " max_num_tokens=%d", s.st.maxTokens)
	}
	if s.st.chunked {
		fmt.Fprintf(&b, " chunking=on unit=%d", s.st.unit)
	} else {
		b.WriteString(" chunking=off")
	}
	switch {
	case s.cfg.CostMode == CostAuto && !s.st.cost.on:
		b.WriteString(" equal-cost=auto(waiting for calibration)")
	case s.st.cost.on:
		c := s.st.cost
		fmt.Fprintf(&b, " equal-cost=on(mode=%s O=%d D=%d R=%d B=%d)", s.cfg.CostMode, c.o, c.d, c.r, c.budget)
	default:
		b.WriteString(" equal-cost=off")
	}
	if s.st.demotion {
		fmt.Fprintf(&b, " demotion=on(U=%d K=%d)", s.cfg.Demotion.UncachedTokens, s.cfg.Demotion.MaxIters)
	} else {
		b.WriteString(" demotion=off")
	}
	fmt.Fprintf(&b, " recompute-pause=%s prefix-aware=%s", onOff(s.cfg.RecomputePause), onOff(s.cfg.PrefixAware))
	if s.cfg.Helix {
		b.WriteString(" helix=on")
	}
	return b.String()
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

// PagesToCompletion is ceil((PromptLen + MaxNewTokens) / ledgerBlock), the
// pages a request could ever need (spec §14.2; prefix sharing ignored).
func PagesToCompletion(r *Request, ledgerBlock int) int {
	if ledgerBlock <= 0 {
		return 0
	}
	return (r.PromptLen + r.MaxNewTokens + ledgerBlock - 1) / ledgerBlock
}
