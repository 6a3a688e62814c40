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
			"(O=%d from %s, D=%d from %s, R=%d from %s, M=%d from %s); lower them",
			ErrConfig, o, cfg.Name(SettingKVCostOffset), d, cfg.Name(SettingKVDepthThreshold),
			r, cfg.Name(SettingPerChunkDepthTokens), cfg.MaxNumTokens, cfg.Name(SettingMaxNumTokens))
	}
	floor := int64(cfg.MaxNumTokens / 4)
	if int64(unit) > floor {
		floor = int64(unit)
	}
	return costParams{on: true, o: o, d: d, r: r, budget: b, floor: floor}, nil
}

// validate checks cfg and derives the effective settings. Errors name the
// setting as the caller's user knows it (Config.Name) and say what is allowed.
func validate(cfg *Config) (settings, error) {
	var st settings
	bad := func(s Setting, v any, want string) (settings, error) {
		return st, fmt.Errorf("%w: %s = %v, want %s", ErrConfig, cfg.Name(s), v, want)
	}
	if cfg.MaxBatchSize < 0 {
		return bad(SettingMaxBatchSize, cfg.MaxBatchSize, "≥ 0")
	}
	if cfg.SchedulerCapacity < 0 {
		return bad(SettingSchedulerCapacity, cfg.SchedulerCapacity, "≥ 0")
	}
	if cfg.MaxNumTokens < 0 && cfg.MaxNumTokens != Unlimited {
		return bad(SettingMaxNumTokens, cfg.MaxNumTokens, "≥ 0 or unlimited")
	}
	if cfg.LedgerBlockTokens < 0 {
		return st, fmt.Errorf("%w: ledger block tokens = %d, want ≥ 0", ErrConfig, cfg.LedgerBlockTokens)
	}
	if cfg.ChunkUnitSize < 0 {
		return bad(SettingChunkUnitSize, cfg.ChunkUnitSize, "≥ 1")
	}
	if cfg.Policy != MaxUtilization && cfg.Policy != GuaranteedNoEvict {
		return bad(SettingPolicy, int(cfg.Policy), "MAX_UTILIZATION or GUARANTEED_NO_EVICT")
	}
	if cfg.AdmissionLookahead < 0 {
		return bad(SettingAdmissionLookahead, cfg.AdmissionLookahead, "≥ 0 (0 = off)")
	}
	if cfg.CostMode < CostOff || cfg.CostMode > CostAuto {
		return st, fmt.Errorf("%w: ctx_cost.mode = %d, want off, manual or auto", ErrConfig, int(cfg.CostMode))
	}
	for _, v := range []struct {
		s   Setting
		val int64
	}{
		{SettingKVCostOffset, cfg.EqualCost.KVOffset},
		{SettingKVDepthThreshold, cfg.EqualCost.KVDepthThreshold},
		{SettingPerChunkDepthTokens, cfg.EqualCost.PerChunkDepthTokens},
		{SettingDemoteUncachedTokens, cfg.Demotion.UncachedTokens},
		{SettingDemoteMaxIters, cfg.Demotion.MaxIters},
	} {
		if v.val < 0 {
			return bad(v.s, v.val, "≥ 0")
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
		return bad(SettingChunkUnitSize, cfg.ChunkUnitSize, "≥ 1 (or a ledger block size to default to)")
	}
	st.chunked = cfg.ChunkedContext
	if !st.chunked && st.maxTokens != Unlimited && st.unit > st.maxTokens {
		// With chunking off the unit sizes only the chunked re-prefill of
		// a recompute-reset prompt that outgrew M (rechunked); a unit above
		// M (the default block of large pages, or a --chunk-unit the
		// validation below checks only with chunking on) would never fit a
		// pass, and the request would stall the rank.
		st.unit = st.maxTokens
	}
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
	vars := [5]struct {
		name string
		s    Setting
	}{
		{EnvCostKVOffset, SettingKVCostOffset}, {EnvCostKVDepthThreshold, SettingKVDepthThreshold},
		{EnvCostPerChunkDepthTokens, SettingPerChunkDepthTokens}, {EnvDemoteUncachedTokens, SettingDemoteUncachedTokens},
		{EnvDemoteMaxIters, SettingDemoteMaxIters},
	}
	vals := [5]int64{}
	set := [5]bool{}
	for i, v := range vars {
		val, ok, err := read(v.name)
		if err != nil {
			return base, nil, err
		}
		vals[i], set[i] = val, ok
	}
	// apply sets variable i's value and makes the variable the setting's name.
	apply := func(i int, dst *int64) {
		*dst = vals[i]
		cfg.Names[vars[i].s] = vars[i].name
	}
	if cfg.CostMode == CostOff {
		if set[0] {
			apply(0, &cfg.EqualCost.KVOffset)
		}
		if set[1] {
			apply(1, &cfg.EqualCost.KVDepthThreshold)
		}
		if set[2] {
			apply(2, &cfg.EqualCost.PerChunkDepthTokens)
		}
	} else {
		for i, name := range []string{EnvCostKVOffset, EnvCostKVDepthThreshold} {
			if set[i] {
				notes = append(notes, fmt.Sprintf("%s ignored: ctx_cost.mode is %s", name, cfg.CostMode))
			}
		}
		if set[2] && cfg.EqualCost.PerChunkDepthTokens == 0 {
			apply(2, &cfg.EqualCost.PerChunkDepthTokens)
		}
	}
	if set[3] {
		apply(3, &cfg.Demotion.UncachedTokens)
	}
	if set[4] {
		apply(4, &cfg.Demotion.MaxIters)
	}

	if cfg.CostMode != CostAuto {
		o, d := cfg.EqualCost.KVOffset, cfg.EqualCost.KVDepthThreshold
		oName, dName := cfg.Name(SettingKVCostOffset), cfg.Name(SettingKVDepthThreshold)
		switch {
		case o > 0 && d == 0:
			notes = append(notes, "equal-cost cap stays off: "+dName+" is 0")
		case d > 0 && o == 0:
			notes = append(notes, "equal-cost cap stays off: "+oName+" is 0")
		case o > 0 && d > 0 && cfg.MaxNumTokens == Unlimited:
			notes = append(notes, "equal-cost cap stays off: "+cfg.Name(SettingMaxNumTokens)+" is unlimited")
		case o > 0 && d > 0 && !cfg.ChunkedContext:
			notes = append(notes, "equal-cost cap stays off: "+cfg.Name(SettingChunkedContext)+" is false")
		}
	}
	if cfg.Demotion.UncachedTokens > 0 && !cfg.ChunkedContext {
		notes = append(notes, "long-prefill demotion stays off: "+cfg.Name(SettingChunkedContext)+" is false")
	}
	if cfg.Demotion.MaxIters > 0 && cfg.Demotion.UncachedTokens == 0 {
		notes = append(notes, cfg.Name(SettingDemoteMaxIters)+" has no effect: "+cfg.Name(SettingDemoteUncachedTokens)+" is 0")
	}
	if _, err := validate(&cfg); err != nil {
		return base, nil, err
	}
	return cfg, notes, nil
}

// CheckServable reports a configuration under which requests that arrive
// could never be scheduled, naming the settings in conflict (Config.Name).
// New accepts such configurations because the spec's scenarios use them
// (§6: M = 0 schedules nothing; T-CHK-03: a unit above M schedules no
// chunk), but a deployment that serves requests must refuse them at
// startup instead of stalling (§15) after its first arrival:
//
//   - M = 0, or no request slot (max_num_requests 0);
//   - chunking on with a finite M below the chunk unit u: a chunk that is
//     not a prompt's last is rounded down to a multiple of u (§7.2 step 6),
//     so a prompt with more than M tokens left would never get one.
//
// It returns New's validation error, if any, first.
func (c Config) CheckServable() error {
	st, err := validate(&c)
	if err != nil {
		return err
	}
	switch {
	case st.maxTokens == 0:
		return fmt.Errorf("%w: %s = 0 schedules nothing, so no request could ever run; want ≥ 1 (or unlimited)",
			ErrConfig, c.Name(SettingMaxNumTokens))
	case st.maxRequests == 0:
		return fmt.Errorf("%w: %s = 0 leaves no request slot per iteration, so no request could ever run; want ≥ 1",
			ErrConfig, c.Name(SettingMaxBatchSize))
	case st.chunked && st.maxTokens != Unlimited && st.unit > st.maxTokens:
		return fmt.Errorf("%w: chunk unit %s = %d is larger than the token budget %s = %d: with chunked prefill "+
			"a chunk that is not a prompt's last is a multiple of the unit, so a prompt with more than %d tokens "+
			"left would never be scheduled; lower the chunk unit to at most %d or raise the token budget to at least %d",
			ErrConfig, c.Name(SettingChunkUnitSize), st.unit, c.Name(SettingMaxNumTokens), st.maxTokens,
			st.maxTokens, st.maxTokens, st.unit)
	}
	return nil
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
	if s.watermarkOn() {
		fmt.Fprintf(&b, " admission-lookahead=%d", s.cfg.AdmissionLookahead)
	}
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
