//go:build native

package tests

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// seededSource gives every arrival params with seed seedBase + id.
type seededSource struct {
	executor.Source
	params   bridge.SamplingParams
	seedBase uint64
}

func (s *seededSource) Due(now time.Time) []executor.Arrival {
	items := s.Source.Due(now)
	for i := range items {
		items[i].Sampling = s.params
		items[i].Sampling.Seed = s.seedBase + items[i].ID
	}
	return items
}

// serveCPU runs reqs on in-process ranks of the native CPU engine (tiny
// preset) and returns every request's output by id.
func serveCPU(t *testing.T, reqs []workload.Request, ranks int, overlap, chunked bool, params bridge.SamplingParams) map[uint64][]int32 {
	t.Helper()
	sc := scheduler.Config{MaxBatchSize: 8, MaxNumTokens: 256, ChunkedContext: chunked, ChunkUnitSize: 8,
		Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true, LedgerBlockTokens: 8}
	if chunked {
		sc.MaxNumTokens = 24 // 40-token prompts in chunks
	}
	comms := nccl.NewLocalGroup(ranks, nccl.LocalOptions{Timeout: time.Minute})
	source := &seededSource{Source: executor.NewTraceSource(reqs, time.Now()), params: params, seedBase: 500}
	execs := make([]*executor.Executor, ranks)
	for i := range execs {
		eng, err := nativeengine.Open(bridge.Config{Preset: "tiny", Seed: 1, NumPages: 128, TokensPerPage: 8})
		require.NoError(t, err)
		defer eng.Close()
		kv, err := kvpool.New(kvpool.Config{NumPages: 128, TokensPerPage: 8, AttentionDP: ranks > 1, AttentionDPRank: i})
		require.NoError(t, err)
		sch, err := scheduler.New(sc, kv)
		require.NoError(t, err)
		d := executor.Deps{Comm: comms[i], Engine: eng, KV: kv, Planner: sch}
		if i == 0 {
			d.Source = source
		}
		execs[i], err = executor.New(executor.Config{Rank: i, Ranks: ranks, Scheduler: sc, Overlap: overlap,
			MaxIdleSleep: time.Millisecond}, d)
		require.NoError(t, err)
	}
	results := make([]*executor.Result, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for i := range execs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i], errs[i] = execs[i].Run()
			if errs[i] != nil {
				comms[i].Close()
			}
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
	out := map[uint64][]int32{}
	for _, r := range results[0].Responses {
		require.Empty(t, r.Error)
		require.Len(t, r.Output, reqs[r.ID].MaxNewTokens)
		out[r.ID] = r.Output
	}
	require.Len(t, out, len(reqs))
	return out
}

// TestSamplingCPUEngine: on the CPU engine, sampled outputs are the same with
// chunked prefill on and off, on 1 and 2 ranks, in both loops; temperature 0
// is greedy decoding, and sampling differs from it.
func TestSamplingCPUEngine(t *testing.T) {
	var reqs []workload.Request
	for i := range 6 {
		reqs = append(reqs, workload.Request{Index: i, Prompt: workload.AppendBlockTokens(nil, uint64(300+i), 40, 512, 3),
			MaxNewTokens: 12})
	}
	p := bridge.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.9}
	ref := serveCPU(t, reqs, 1, false, true, p)
	require.Equal(t, ref, serveCPU(t, reqs, 1, false, false, p), "chunked prefill off")
	require.Equal(t, ref, serveCPU(t, reqs, 2, true, true, p), "2 ranks, overlap loop")
	require.Equal(t, ref, serveCPU(t, reqs, 2, false, false, p), "2 ranks, unchunked")
	greedy := serveCPU(t, reqs, 1, false, true, bridge.SamplingParams{})
	require.Equal(t, greedy, serveCPU(t, reqs, 2, true, false, bridge.SamplingParams{TopK: 3, TopP: 0.5}),
		"temperature 0 is greedy")
	require.NotEqual(t, greedy, ref, "sampling at temperature 0.8 equals greedy decoding")
}
