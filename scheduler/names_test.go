package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSettingNamesInErrors: every validation error names the setting the
// way the caller's user set it (Config.Names), and falls back to the spec's
// name (the TLLM_* variable, the config key) when the caller gave none.
func TestSettingNamesInErrors(t *testing.T) {
	for _, tc := range []struct {
		setting Setting
		edit    func(*Config)
		spec    string
	}{
		{SettingMaxBatchSize, func(c *Config) { c.MaxBatchSize = -1 }, "max_batch_size"},
		{SettingSchedulerCapacity, func(c *Config) { c.SchedulerCapacity = -1 }, "scheduler_capacity"},
		{SettingMaxNumTokens, func(c *Config) { c.MaxNumTokens = -7 }, "max_num_tokens"},
		{SettingChunkUnitSize, func(c *Config) { c.ChunkUnitSize = -2 }, "chunk_unit_size"},
		{SettingKVCostOffset, func(c *Config) { c.EqualCost.KVOffset = -1 }, EnvCostKVOffset},
		{SettingKVDepthThreshold, func(c *Config) { c.EqualCost.KVDepthThreshold = -1 }, EnvCostKVDepthThreshold},
		{SettingPerChunkDepthTokens, func(c *Config) { c.EqualCost.PerChunkDepthTokens = -1 }, EnvCostPerChunkDepthTokens},
		{SettingDemoteUncachedTokens, func(c *Config) { c.Demotion.UncachedTokens = -1 }, EnvDemoteUncachedTokens},
		{SettingDemoteMaxIters, func(c *Config) { c.Demotion.MaxIters = -1 }, EnvDemoteMaxIters},
	} {
		c := baseConfig()
		tc.edit(&c)
		_, err := New(c, newFakeKV())
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, tc.spec, "without a caller's name the spec's name")

		c.Names[tc.setting] = "cfg.yaml:7 scheduler.some_key"
		_, err = New(c, newFakeKV())
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, "cfg.yaml:7 scheduler.some_key")
		require.NotContains(t, err.Error(), tc.spec, "the caller's name replaces the spec's")
	}
}

// TestSettingNamesFromEnv: a TLLM_* variable that overrides a setting
// becomes its name; a setting the environment leaves alone keeps the
// caller's name, in errors and in notes.
func TestSettingNamesFromEnv(t *testing.T) {
	c := baseConfig()
	c.ChunkedContext, c.MaxNumTokens = true, 8192
	c.Names[SettingKVCostOffset] = "cfg.yaml:3 scheduler.equal_cost.kv_cost_offset"
	c.Names[SettingKVDepthThreshold] = "cfg.yaml:4 scheduler.equal_cost.kv_depth_threshold"
	c.EqualCost.KVOffset = 35000

	// D is 0 in the file: the note names the file's key, not the variable.
	_, notes, err := ConfigFromEnv(c, envOf(nil))
	require.NoError(t, err)
	require.Equal(t, []string{"equal-cost cap stays off: cfg.yaml:4 scheduler.equal_cost.kv_depth_threshold is 0"}, notes)

	// The variable overrides O: the budget error names the variable for O
	// and the file for D.
	got, _, err := ConfigFromEnv(c, envOf(map[string]string{EnvCostKVOffset: "1"}))
	require.NoError(t, err)
	require.Equal(t, EnvCostKVOffset, got.Name(SettingKVCostOffset))
	c.EqualCost.KVDepthThreshold = 1 << 61
	_, _, err = ConfigFromEnv(c, envOf(map[string]string{EnvCostKVOffset: "9"}))
	require.ErrorContains(t, err, "2^62")
	require.ErrorContains(t, err, EnvCostKVOffset)
	require.ErrorContains(t, err, "cfg.yaml:4 scheduler.equal_cost.kv_depth_threshold")
	require.NotContains(t, err.Error(), "TLLM_V2_CTX_COST_*")

	// Demotion from a scenario key, overridden by nothing.
	d := baseConfig()
	d.Names[SettingDemoteUncachedTokens] = "config.demotion.uncached_tokens"
	d.Demotion.UncachedTokens = 5
	_, notes, err = ConfigFromEnv(d, envOf(nil))
	require.NoError(t, err)
	require.Equal(t, []string{"long-prefill demotion stays off: enable_chunked_context is false"}, notes)
	d.Demotion.UncachedTokens, d.Demotion.MaxIters = 0, 3
	d.Names[SettingDemoteMaxIters] = "config.demotion.max_iters"
	_, notes, err = ConfigFromEnv(d, envOf(nil))
	require.NoError(t, err)
	require.Equal(t, []string{"config.demotion.max_iters has no effect: config.demotion.uncached_tokens is 0"}, notes)
}

// TestCheckServable: configurations New accepts for the spec's scenarios
// but under which a serving deployment could never finish a request are
// refused, naming both settings of a conflict.
func TestCheckServable(t *testing.T) {
	named := func(c Config) Config {
		c.Names[SettingMaxNumTokens] = "--max-num-tokens"
		c.Names[SettingChunkUnitSize] = "--chunk-unit"
		c.Names[SettingMaxBatchSize] = "--max-batch-size"
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // empty: servable
	}{
		{"defaults", func(c *Config) {}, nil},
		{"unit equals M", func(c *Config) { c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 16, 16 }, nil},
		{"unit above M", func(c *Config) { c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 2048, 1024 },
			[]string{"--chunk-unit = 2048", "--max-num-tokens = 1024"}},
		{"default unit above M", func(c *Config) { c.ChunkedContext, c.LedgerBlockTokens, c.MaxNumTokens = true, 16, 4 },
			[]string{"--chunk-unit = 16", "--max-num-tokens = 4"}},
		{"unit above M without chunking", func(c *Config) { c.ChunkUnitSize, c.MaxNumTokens = 2048, 1024 }, nil},
		{"unit above unlimited M", func(c *Config) { c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 2048, Unlimited }, nil},
		{"M zero", func(c *Config) { c.MaxNumTokens = 0 }, []string{"--max-num-tokens = 0"}},
		{"no request slot", func(c *Config) { c.MaxBatchSize = 0 }, []string{"--max-batch-size = 0"}},
		{"capacity replaces the batch size", func(c *Config) { c.MaxBatchSize, c.SchedulerCapacity = 0, 5 }, nil},
		{"invalid", func(c *Config) { c.MaxNumTokens = -3 }, []string{"--max-num-tokens = -3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := named(baseConfig())
			tc.edit(&c)
			err := c.CheckServable()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrConfig)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	// New itself still accepts what the spec's scenarios use (T-CHK-03, M = 0).
	c := baseConfig()
	c.ChunkedContext, c.ChunkUnitSize, c.MaxNumTokens = true, 64, 50
	mustNew(t, c, newFakeKV())
	c.MaxNumTokens = 0
	mustNew(t, c, newFakeKV())
}

// TestHelixFatalNamesTheCallersSettings: the Helix allocation failure with
// recompute pause off tells the user which of their settings to change.
func TestHelixFatalNamesTheCallersSettings(t *testing.T) {
	f := newFakeKV()
	f.P, f.helix = 4, true
	f.allocFn = func(int, *Request) bool { return false }
	list := []*Request{gen(0)}
	f.register(list)
	c := baseConfig()
	c.Helix, c.LedgerBlockTokens, c.RecomputePause = true, 8, false
	c.Names[SettingRecomputePause] = "cfg.yaml:9 scheduler.enable_recompute_pause"
	c.Names[SettingPoolSize] = "--pages (KV pages per CP rank)"
	_, err := mustNew(t, c, f).Schedule(list, nil)
	require.ErrorIs(t, err, ErrHelixNoRecompute)
	require.ErrorContains(t, err, "enable recompute pause (cfg.yaml:9 scheduler.enable_recompute_pause)")
	require.ErrorContains(t, err, "size the pool with --pages (KV pages per CP rank)")
	require.NotContains(t, err.Error(), "max_gpu_total_bytes")
}
