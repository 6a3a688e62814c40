package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// fileConfig is the YAML configuration file (--config). Flags given on the
// command line override it; the TLLM_* environment variables override the
// scheduler section.
type fileConfig struct {
	Engine    *string          `yaml:"engine"`
	Model     *string          `yaml:"model"`
	Seed      *uint64          `yaml:"seed"`
	Ranks     *int             `yaml:"ranks"`
	Overlap   *string          `yaml:"overlap"`
	Router    *string          `yaml:"router"`
	CP        *int             `yaml:"cp"`
	KV        kvFileConfig     `yaml:"kv"`
	Scheduler schedFileConfig  `yaml:"scheduler"`
	Workload  workloadFileConf `yaml:"workload"`
}

type kvFileConfig struct {
	Pages         *int `yaml:"pages"`
	TokensPerPage *int `yaml:"tokens_per_page"`
	HostPages     *int `yaml:"host_pages"`
	MaxSeqLen     *int `yaml:"max_seq_len"`
	// EnableBlockReuse is the spec's enable_block_reuse (default true).
	EnableBlockReuse   *bool `yaml:"enable_block_reuse"`
	EventBufferMaxSize *int  `yaml:"event_buffer_max_size"`
}

type schedFileConfig struct {
	MaxBatchSize      *int    `yaml:"max_batch_size"`
	SchedulerCapacity *int    `yaml:"scheduler_capacity"`
	MaxNumTokens      *int    `yaml:"max_num_tokens"` // 0 or negative = unlimited
	ChunkedContext    *bool   `yaml:"enable_chunked_context"`
	ChunkUnitSize     *int    `yaml:"chunk_unit_size"`
	Policy            *string `yaml:"capacity_policy"`
	RecomputePause    *bool   `yaml:"enable_recompute_pause"`
	PrefixAware       *bool   `yaml:"enable_prefix_aware_scheduling"`
	EqualCost         struct {
		KVOffset            *int64 `yaml:"kv_offset"`
		KVDepthThreshold    *int64 `yaml:"kv_depth_threshold"`
		PerChunkDepthTokens *int64 `yaml:"per_chunk_depth_tokens"`
	} `yaml:"equal_cost"`
	Demotion struct {
		UncachedTokens *int64 `yaml:"uncached_tokens"`
		MaxIters       *int64 `yaml:"max_iters"`
	} `yaml:"demotion"`
}

type workloadFileConf struct {
	Trace        *string  `yaml:"trace"`
	Limit        *int     `yaml:"limit"`
	LengthScale  *float64 `yaml:"length_scale"`
	ArrivalScale *float64 `yaml:"arrival_scale"`
}

// loadFileConfig reads a YAML config; unknown keys are errors naming them.
func loadFileConfig(path string) (*fileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config %s: %v", path, err)
	}
	return &fc, nil
}

// parsePolicy accepts the spec's names, case-insensitively.
func parsePolicy(s string) (scheduler.Policy, error) {
	switch strings.ToLower(s) {
	case "max_utilization":
		return scheduler.MaxUtilization, nil
	case "guaranteed_no_evict":
		return scheduler.GuaranteedNoEvict, nil
	}
	return 0, usageErrorf("capacity policy %q is not allowed (allowed: max_utilization, guaranteed_no_evict)", s)
}

// apply copies every set field of the file config into opts, unless the
// corresponding flag was given on the command line (set[flag] true).
func (fc *fileConfig) apply(o *serveOptions, set map[string]bool) error {
	str := func(flag string, dst *string, v *string) {
		if v != nil && !set[flag] {
			*dst = *v
		}
	}
	num := func(flag string, dst *int, v *int) {
		if v != nil && !set[flag] {
			*dst = *v
		}
	}
	str("engine", &o.engine, fc.Engine)
	str("model", &o.model, fc.Model)
	if fc.Seed != nil && !set["seed"] {
		o.seed = *fc.Seed
	}
	num("ranks", &o.ranks, fc.Ranks)
	if fc.Ranks != nil {
		o.ranksSet = true // an explicit rank count, as if given as a flag
	}
	str("overlap", &o.overlap, fc.Overlap)
	str("router", &o.routerName, fc.Router)
	num("cp", &o.cp, fc.CP)
	if fc.KV.EnableBlockReuse != nil && !set["no-prefix-reuse"] {
		o.noPrefixReuse = !*fc.KV.EnableBlockReuse
	}
	num("event-buffer-max-size", &o.eventBufferMaxSize, fc.KV.EventBufferMaxSize)
	num("pages", &o.pages, fc.KV.Pages)
	num("tokens-per-page", &o.tokensPerPage, fc.KV.TokensPerPage)
	num("host-pages", &o.hostPages, fc.KV.HostPages)
	num("max-seq-len", &o.maxSeqLen, fc.KV.MaxSeqLen)
	s := fc.Scheduler
	num("max-batch-size", &o.maxBatchSize, s.MaxBatchSize)
	num("max-num-tokens", &o.maxNumTokens, s.MaxNumTokens)
	num("chunk-unit", &o.chunkUnit, s.ChunkUnitSize)
	if s.SchedulerCapacity != nil {
		o.sched.SchedulerCapacity = *s.SchedulerCapacity
	}
	if s.ChunkedContext != nil && !set["chunked-prefill"] {
		o.chunked = *s.ChunkedContext
	}
	str("policy", &o.policy, s.Policy)
	if s.RecomputePause != nil {
		o.sched.RecomputePause = *s.RecomputePause
	}
	if s.PrefixAware != nil {
		o.sched.PrefixAware = *s.PrefixAware
	}
	set64 := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	set64(&o.sched.EqualCost.KVOffset, s.EqualCost.KVOffset)
	set64(&o.sched.EqualCost.KVDepthThreshold, s.EqualCost.KVDepthThreshold)
	set64(&o.sched.EqualCost.PerChunkDepthTokens, s.EqualCost.PerChunkDepthTokens)
	set64(&o.sched.Demotion.UncachedTokens, s.Demotion.UncachedTokens)
	set64(&o.sched.Demotion.MaxIters, s.Demotion.MaxIters)
	w := fc.Workload
	str("trace", &o.trace, w.Trace)
	num("limit", &o.limit, w.Limit)
	if w.LengthScale != nil && !set["length-scale"] {
		o.lengthScale = *w.LengthScale
		o.setOrigin("length-scale", "workload.length_scale")
	}
	if w.ArrivalScale != nil && !set["arrival-scale"] {
		o.arrivalScale = *w.ArrivalScale
		o.setOrigin("arrival-scale", "workload.arrival_scale")
	}
	return nil
}
