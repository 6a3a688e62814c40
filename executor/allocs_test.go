package executor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/internal/racetest"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// decodeRank is one rank (real scheduler, KV pool and executor over the fake
// engine) whose batch requests have all reached generation: every further
// iteration is a decode of the whole batch.
func decodeRank(t testing.TB, batch int, overlap bool) *Executor {
	t.Helper()
	const pages, ppt = 4096, 16
	sc := scheduler.Config{MaxBatchSize: batch, MaxNumTokens: 4096, ChunkedContext: true, ChunkUnitSize: 16,
		Policy: scheduler.MaxUtilization, PrefixAware: true, LedgerBlockTokens: ppt}
	kv, err := kvpool.New(kvpool.Config{NumPages: pages, TokensPerPage: ppt})
	require.NoError(t, err)
	sch, err := scheduler.New(sc, kv)
	require.NoError(t, err)
	eng, err := fake.New(bridge.Config{Preset: "tiny", NumPages: pages, TokensPerPage: ppt, Seed: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	comms := nccl.NewLocalGroup(1, nccl.LocalOptions{Timeout: time.Minute})
	reqs := longOutputRequests(batch, 16, 400)
	ex, err := New(Config{Rank: 0, Ranks: 1, Scheduler: sc, Overlap: overlap},
		Deps{Comm: comms[0], Engine: eng, KV: kv, Planner: sch, Source: NewTraceSource(reqs, time.Now())})
	require.NoError(t, err)
	for i := 0; i < 32; i++ {
		more, err := ex.iteration()
		require.NoError(t, err)
		require.True(t, more)
	}
	require.Len(t, ex.active, batch, "every request is active")
	for _, r := range ex.active {
		require.False(t, r.State.IsContext(), "request %d is still in its context phase", r.ID)
	}
	return ex
}

// TestDecodeIterationAllocations (issue 24 item 3): at steady state a decode
// iteration of the scheduler, the KV pool and the executor allocates nothing
// (output tokens go into each request's preallocated buffer, the step
// descriptor is rebuilt in place). Allocation counts are deterministic, so
// this is a test; the time is BenchmarkDecodeHostOverheadCPU's (tests/).
func TestDecodeIterationAllocations(t *testing.T) {
	if racetest.Enabled {
		t.Skip("the race detector allocates")
	}
	for _, batch := range []int{64, 256} {
		for _, overlap := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%d/overlap=%v", batch, overlap), func(t *testing.T) {
				ex := decodeRank(t, batch, overlap)
				var iterErr error
				allocs := testing.AllocsPerRun(100, func() {
					if _, err := ex.iteration(); err != nil && iterErr == nil {
						iterErr = err
					}
				})
				require.NoError(t, iterErr)
				require.Zero(t, allocs, "allocations per steady-state decode iteration")
			})
		}
	}
}
