package fleet

import (
	"time"

	"math"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler/router"
	"github.com/lockstep-ai/lockstep/serve/kvevents"
)

// Validate refuses impossible configurations before any work starts, in a
// fixed order (the first failure is reported). Errors name where each value
// came from (Src): the flag, or the config file's FILE:LINE key. It opens
// the checkpoint of --model PATH and builds the twin's cost profile.
func (o *Options) Validate() error {
	for _, check := range []func() error{
		o.validateEngine, o.validatePrompts, o.validateNames, o.validateHelix, o.validateCounts,
		o.validateScales, o.validateTimeout, o.validateKVEvents, o.validateOutputs,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateEngine checks the engine, the model, the pool's sizing from GPU
// memory and the twin's and calibrator's settings.
func (o *Options) validateEngine() error {
	if err := usage.OneOf(o.Src("engine"), o.Engine, "cpu", "cuda", "twin", "fake"); err != nil {
		return err
	}
	if err := usage.OneOf(o.Src("twin-host-time"), o.TwinHostTime, "profile", "measured"); err != nil {
		return err
	}
	if o.TwinThreads < 0 || o.TwinThreads > maxTwinThreads {
		return usage.Errorf("%s must be between 0 (automatic) and %d, got %d", o.Src("twin-threads"), maxTwinThreads, o.TwinThreads)
	}
	if err := o.openModel(); err != nil {
		return err
	}
	if o.Pages == 0 && o.Engine != "cuda" && o.Engine != "twin" {
		return usage.Errorf("%s must be at least 1 (0 sizes the pool from GPU memory and needs --engine cuda or twin)",
			o.Src("pages"))
	}
	if !(o.GPUMemFraction > 0 && o.GPUMemFraction <= 1) {
		return usage.Errorf("%s must be in (0, 1], got %v", o.Src("gpu-mem-fraction"), o.GPUMemFraction)
	}
	if err := o.validateTwin(); err != nil {
		return err
	}
	if err := o.validateCtxCost(); err != nil {
		return err
	}
	o.defaultCheckpointPages()
	if o.Engine != "twin" && o.loaded == nil {
		if _, err := bridge.LookupPreset(o.Model); err != nil {
			return usage.Errorf("%s: %v (or give a checkpoint path)", o.Src("model"), err)
		}
	}
	return nil
}

// validateNames checks the settings that take one of a few names.
func (o *Options) validateNames() error {
	for _, c := range []struct {
		flag, v string
		allowed []string
	}{
		{"report", o.Report, []string{"text", "json"}},
		{"progress", o.Progress, []string{"auto", "bar", "lines", "off"}},
		{"log-level", o.LogLevel, []string{"debug", "info", "warn", "error"}},
		{"overlap", o.Overlap, []string{"on", "off"}},
		{"new-conv-placement", o.NewConvPlacement, router.Placements},
	} {
		if err := usage.OneOf(o.Src(c.flag), c.v, c.allowed...); err != nil {
			return err
		}
	}
	if _, err := parsePolicy(o.PolicyName()); err != nil {
		return usage.Errorf("%s: %v", o.Src("policy"), err)
	}
	switch w := o.LoadBalanceWeight; {
	case math.IsNaN(w) || math.IsInf(w, 0) || w < 0:
		return usage.Errorf("%s must be a finite number ≥ 0 (0 = off), got %v", o.Src("load-balance-weight"), w)
	case w > 0 && o.NewConvPlacement != router.PlacementLeastTokens && o.NewConvPlacement != router.PlacementLeastPrefill:
		return usage.Errorf("%s %v weighs each rank's tokens, so it needs %s least_tokens or least_prefill, got %q",
			o.Src("load-balance-weight"), w, o.Src("new-conv-placement"), o.NewConvPlacement)
	}
	return usage.OneOf(o.Src("router"), o.Router, "default", "conversation")
}

// validateHelix checks --cp and what aggregated Helix excludes.
func (o *Options) validateHelix() error {
	switch {
	case o.CP < 1:
		return usage.Errorf("%s must be at least 1, got %d", o.Src("cp"), o.CP)
	case o.CP > 1 && o.Ranks > 1:
		return usage.Errorf("%s %d with %s %d: Helix and attention DP are mutually exclusive; use --ranks 1 with --cp",
			o.Src("cp"), o.CP, o.Src("ranks"), o.Ranks)
	case o.CP > 1 && o.HostPages > 0:
		return usage.Errorf("%s %d with %s %d: aggregated Helix does not support a host cache tier",
			o.Src("host-pages"), o.HostPages, o.Src("cp"), o.CP)
	case o.CP > 1 && o.Engine != "cpu" && o.Engine != "cuda":
		return usage.Errorf("%s %d needs --engine cpu or cuda (the %s engine of %s has no Helix attention)",
			o.Src("cp"), o.CP, o.Engine, o.Src("engine"))
	}
	return nil
}

// intSetting is a count and its flag, for the range checks.
type intSetting struct {
	flag string
	v    int
}

// validateKVEvents checks kv_events_config (and its flags).
func (o *Options) validateKVEvents() error {
	c := &o.KVEventsConfig
	if c.Publisher != "null" && c.Publisher != "zmq" {
		return usage.Errorf("kv_events_config.publisher must be null or zmq, got %q", c.Publisher)
	}
	if !o.kvZMQ() {
		return nil
	}
	pc := o.kvPublisherConfig(0)
	if err := pc.Validate(); err != nil {
		return usage.Errorf("%s: %v", o.Src("kv-events-endpoint"), err)
	}
	if o.world() > 1 && o.CP <= 1 {
		// Every rank's endpoint must be derivable (vLLM refuses ipc with DP).
		if _, err := kvevents.OffsetEndpoint(c.Endpoint, 1); err != nil {
			return usage.Errorf("%s: %v", o.Src("kv-events-endpoint"), err)
		}
	}
	return nil
}

// validateCounts checks the counts' ranges.
func (o *Options) validateCounts() error {
	for _, p := range []intSetting{{"event-buffer-max-size", o.EventBufferMaxSize}, {"max-active-per-rank", o.MaxActivePerRank},
		{"ranks", o.Ranks}, {"tokens-per-page", o.TokensPerPage}, {"max-batch-size", o.Scheduler.MaxBatchSize}} {
		if p.v < 1 {
			return usage.Errorf("%s must be at least 1, got %d", o.Src(p.flag), p.v)
		}
	}
	for _, p := range []intSetting{{"pages", o.Pages}, {"host-pages", o.HostPages}, {"max-seq-len", o.MaxSeqLen},
		{"max-num-tokens", o.Scheduler.MaxNumTokens}, {"chunk-unit", o.Scheduler.ChunkUnitSize}, {"limit", o.Limit},
		{"attention-dp-timeout-iters", o.ADPBalance.TimeoutIters}, {"attention-dp-batching-wait-iters", o.ADPBalance.BatchingWaitIters}} {
		if p.v < 0 {
			return usage.Errorf("%s must be non-negative, got %d", o.Src(p.flag), p.v)
		}
	}
	if err := usage.OneOf(o.Src("cpu-kernels"), o.CPUKernels, bridge.CPUKernelNames...); err != nil {
		return err
	}
	if o.CPUThreads < 0 || o.CPUThreads > MaxCPUThreads {
		return usage.Errorf("%s must be in 0..%d (0 = the cores this process may use, shared by its ranks), got %d",
			o.Src("cpu-threads"), MaxCPUThreads, o.CPUThreads)
	}
	for _, p := range []intSetting{{"pages", o.Pages}, {"host-pages", o.HostPages}} {
		if p.v > kvpool.MaxPages {
			return usage.Errorf("%s must be at most %d (int32 page indices), got %d", o.Src(p.flag), kvpool.MaxPages, p.v)
		}
	}
	return nil
}

// validateTimeout checks the collective watchdog's timeout.
func (o *Options) validateTimeout() error {
	if o.CollectiveTimeout <= 0 {
		return usage.Errorf("%s must be positive, got %v", o.Src("collective-timeout"), o.CollectiveTimeout)
	}
	if o.IdlePoll < 0 || o.IdlePoll > time.Second {
		return usage.Errorf("%s must be between 0 (off) and 1s, got %v", o.Src("idle-poll"), o.IdlePoll)
	}
	return nil
}
