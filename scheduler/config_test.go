package scheduler

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// Spec §18.2: construction and configuration.
func TestConstruction(t *testing.T) {
	t.Run("T-CON-01", func(t *testing.T) {
		s := mustNew(t, baseConfig(), newFakeKV())
		require.Equal(t, 1024, s.MaxNumTokens())
		require.Equal(t, 100, s.MaxNumRequests())
	})
	t.Run("T-CON-02", func(t *testing.T) {
		c := baseConfig()
		c.SchedulerCapacity = 5
		require.Equal(t, 5, mustNew(t, c, newFakeKV()).MaxNumRequests())
	})
	t.Run("T-CON-03", func(t *testing.T) {
		c := baseConfig()
		c.ChunkUnitSize = 100
		require.Equal(t, 100, mustNew(t, c, newFakeKV()).ChunkUnitSize())
	})
	t.Run("T-CON-04", func(t *testing.T) {
		c := baseConfig()
		c.ChunkUnitSize = 128
		require.Equal(t, 128, mustNew(t, c, newFakeKV()).ChunkUnitSize())
		c.ChunkUnitSize = 0 // defaults to one ledger block
		require.Equal(t, 64, mustNew(t, c, newFakeKV()).ChunkUnitSize())
	})
	t.Run("T-CON-05", func(t *testing.T) {
		c := baseConfig()
		c.MaxNumTokens, c.ChunkedContext = Unlimited, true
		c.EqualCost = EqualCost{KVOffset: 35000, KVDepthThreshold: 250000}
		_, on := mustNew(t, c, newFakeKV()).CostBudget()
		require.False(t, on)
	})
	envErr := func(t *testing.T, name, val string) {
		t.Helper()
		_, _, err := ConfigFromEnv(baseConfig(), envOf(map[string]string{name: val}))
		require.ErrorIs(t, err, ErrConfig)
		require.Contains(t, err.Error(), name)
	}
	t.Run("T-CON-06", func(t *testing.T) { envErr(t, EnvCostKVOffset, "abc") })
	t.Run("T-CON-07", func(t *testing.T) { envErr(t, EnvCostPerChunkDepthTokens, "-1") })
	t.Run("T-CON-08", func(t *testing.T) { envErr(t, EnvDemoteMaxIters, "-1") })
	t.Run("T-CON-09", func(t *testing.T) {
		p, err := ParsePolicy("GUARANTEED_NO_EVICT")
		require.NoError(t, err)
		c := baseConfig()
		c.Policy = p
		mustNew(t, c, newFakeKV())
		p, err = ParsePolicy("guaranteed_no_evict")
		require.NoError(t, err)
		require.Equal(t, GuaranteedNoEvict, p)
	})
	t.Run("T-CON-10", func(t *testing.T) {
		_, err := ParsePolicy("STATIC_BATCH")
		require.ErrorIs(t, err, ErrConfig)
		require.Contains(t, err.Error(), "capacity_policy")
		c := baseConfig()
		c.Policy = Policy(7)
		_, err = New(c, newFakeKV())
		require.ErrorContains(t, err, "capacity_policy")
	})
	t.Run("T-CON-11", func(t *testing.T) {
		envErr(t, EnvCostKVOffset, "-5")
		envErr(t, EnvDemoteUncachedTokens, "-1")
		envErr(t, EnvCostKVDepthThreshold, "1e5")
		c := baseConfig()
		c.Demotion.UncachedTokens = -1
		_, err := New(c, newFakeKV())
		require.ErrorContains(t, err, EnvDemoteUncachedTokens)
	})
	t.Run("T-CON-12", func(t *testing.T) {
		c := baseConfig()
		c.ChunkedContext = true
		got, notes, err := ConfigFromEnv(c, envOf(map[string]string{EnvCostKVOffset: "35000"}))
		require.NoError(t, err)
		require.Equal(t, []string{"equal-cost cap stays off: TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD is 0"}, notes)
		require.Equal(t, int64(35000), got.EqualCost.KVOffset)
		_, on := mustNew(t, got, newFakeKV()).CostBudget()
		require.False(t, on)
	})
}

func TestConfigFromEnv(t *testing.T) {
	c := baseConfig()
	c.ChunkedContext, c.MaxNumTokens, c.ChunkUnitSize = true, 8192, 64
	got, notes, err := ConfigFromEnv(c, envOf(map[string]string{
		EnvCostKVOffset: "35000", EnvCostKVDepthThreshold: "250000", EnvCostPerChunkDepthTokens: "",
		EnvDemoteUncachedTokens: "32768", EnvDemoteMaxIters: "2",
	}))
	require.NoError(t, err)
	require.Empty(t, notes)
	require.Equal(t, EqualCost{KVOffset: 35000, KVDepthThreshold: 250000}, got.EqualCost)
	require.Equal(t, Demotion{UncachedTokens: 32768, MaxIters: 2}, got.Demotion)
	s := mustNew(t, got, newFakeKV())
	b, on := s.CostBudget()
	require.True(t, on)
	require.Equal(t, int64(2334720000), b)
	require.Equal(t, "scheduler: policy=MAX_UTILIZATION max_num_requests=100 max_num_tokens=8192 chunking=on unit=64 "+
		"equal-cost=on(mode=off O=35000 D=250000 R=0 B=2334720000) demotion=on(U=32768 K=2) recompute-pause=on prefix-aware=on",
		s.Describe())

	// B ≥ 2^62 is rejected, naming the variables.
	_, _, err = ConfigFromEnv(c, envOf(map[string]string{EnvCostKVOffset: "1", EnvCostKVDepthThreshold: "1000000000000000000"}))
	require.ErrorContains(t, err, "2^62")
	require.ErrorContains(t, err, "TLLM_V2_CTX_COST")
	// Overflowing O + D is rejected too, not wrapped around.
	_, _, err = ConfigFromEnv(c, envOf(map[string]string{EnvCostKVOffset: "9223372036854775807", EnvCostKVDepthThreshold: "9223372036854775807"}))
	require.ErrorIs(t, err, ErrConfig)

	// Manual mode: O and D from the config; the environment's are ignored with a note.
	m := c
	m.CostMode = CostManual
	m.EqualCost = EqualCost{KVOffset: 1000, KVDepthThreshold: 1000}
	got, notes, err = ConfigFromEnv(m, envOf(map[string]string{EnvCostKVOffset: "5", EnvCostPerChunkDepthTokens: "3000"}))
	require.NoError(t, err)
	require.Equal(t, EqualCost{KVOffset: 1000, KVDepthThreshold: 1000, PerChunkDepthTokens: 3000}, got.EqualCost)
	require.Len(t, notes, 1)
	require.True(t, strings.HasPrefix(notes[0], EnvCostKVOffset+" ignored"))

	// Off everywhere: Describe says so.
	d := mustNew(t, baseConfig(), newFakeKV()).Describe()
	require.Contains(t, d, "chunking=off")
	require.Contains(t, d, "equal-cost=off")
	require.Contains(t, d, "demotion=off")
}

func TestNewValidation(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		name string
	}{
		{func(c *Config) { c.MaxBatchSize = -1 }, "max_batch_size"},
		{func(c *Config) { c.SchedulerCapacity = -1 }, "scheduler_capacity"},
		{func(c *Config) { c.MaxNumTokens = -7 }, "max_num_tokens"},
		{func(c *Config) { c.ChunkUnitSize, c.LedgerBlockTokens = 0, 0 }, "chunk_unit_size"},
		{func(c *Config) { c.EqualCost.PerChunkDepthTokens = -1 }, EnvCostPerChunkDepthTokens},
		{func(c *Config) { c.CostMode = 9 }, "ctx_cost.mode"},
	} {
		c := baseConfig()
		tc.edit(&c)
		_, err := New(c, newFakeKV())
		require.ErrorIs(t, err, ErrConfig, tc.name)
		require.ErrorContains(t, err, tc.name)
	}
	_, err := New(baseConfig(), nil)
	require.ErrorIs(t, err, ErrConfig)
}
