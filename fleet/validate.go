package fleet

import (
	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/kvpool"
)

// Validate refuses impossible configurations before any work starts.
// Errors name where each value came from (src): the flag, or the config
// file's FILE:LINE key.
func (o *Options) Validate() error {
	if err := usage.OneOf(o.Src("engine"), o.Engine, "cpu", "cuda", "twin", "fake"); err != nil {
		return err
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
	if err := o.validatePrompts(); err != nil {
		return err
	}
	if err := usage.OneOf(o.Src("report"), o.Report, "text", "json"); err != nil {
		return err
	}
	if err := usage.OneOf(o.Src("progress"), o.Progress, "auto", "bar", "lines", "off"); err != nil {
		return err
	}
	if err := usage.OneOf(o.Src("log-level"), o.LogLevel, "debug", "info", "warn", "error"); err != nil {
		return err
	}
	if err := usage.OneOf(o.Src("overlap"), o.Overlap, "on", "off"); err != nil {
		return err
	}
	if _, err := parsePolicy(o.PolicyName()); err != nil {
		return usage.Errorf("%s: %v", o.Src("policy"), err)
	}
	if err := usage.OneOf(o.Src("router"), o.Router, "default", "conversation"); err != nil {
		return err
	}
	if o.CP < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.Src("cp"), o.CP)
	}
	if o.CP > 1 && o.Ranks > 1 {
		return usage.Errorf("%s %d with %s %d: Helix and attention DP are mutually exclusive; use --ranks 1 with --cp",
			o.Src("cp"), o.CP, o.Src("ranks"), o.Ranks)
	}
	if o.CP > 1 && o.HostPages > 0 {
		return usage.Errorf("%s %d with %s %d: aggregated Helix does not support a host cache tier",
			o.Src("host-pages"), o.HostPages, o.Src("cp"), o.CP)
	}
	if o.CP > 1 && o.Engine != "cpu" {
		return usage.Errorf("%s %d needs --engine cpu (the %s engine of %s has no Helix attention)",
			o.Src("cp"), o.CP, o.Engine, o.Src("engine"))
	}
	if o.EventBufferMaxSize < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.Src("event-buffer-max-size"), o.EventBufferMaxSize)
	}
	if o.MaxActivePerRank < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.Src("max-active-per-rank"), o.MaxActivePerRank)
	}
	positive := []struct {
		name string
		v    int
	}{{"ranks", o.Ranks}, {"tokens-per-page", o.TokensPerPage}, {"max-batch-size", o.Scheduler.MaxBatchSize}}
	for _, p := range positive {
		if p.v < 1 {
			return usage.Errorf("%s must be at least 1, got %d", o.Src(p.name), p.v)
		}
	}
	nonNeg := []struct {
		name string
		v    int
	}{{"pages", o.Pages}, {"host-pages", o.HostPages}, {"max-seq-len", o.MaxSeqLen}, {"max-num-tokens", o.Scheduler.MaxNumTokens},
		{"chunk-unit", o.Scheduler.ChunkUnitSize}, {"limit", o.Limit}}
	for _, p := range nonNeg {
		if p.v < 0 {
			return usage.Errorf("%s must be non-negative, got %d", o.Src(p.name), p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"pages", o.Pages}, {"host-pages", o.HostPages}} {
		if p.v > kvpool.MaxPages {
			return usage.Errorf("%s must be at most %d (int32 page indices), got %d", o.Src(p.name), kvpool.MaxPages, p.v)
		}
	}
	if err := o.validateScales(); err != nil {
		return err
	}
	if o.CollectiveTimeout <= 0 {
		return usage.Errorf("%s must be positive, got %v", o.Src("collective-timeout"), o.CollectiveTimeout)
	}
	return nil
}
