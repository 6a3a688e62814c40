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

// seededSource gives every arrival params with seed seedBase + id (a
// greedy params keeps seed 0), and the logit bias and stop token ids.
type seededSource struct {
	executor.Source
	params   bridge.SamplingParams
	seedBase uint64
	bias     []bridge.TokenBias
	stopIDs  []int32
}

func (s *seededSource) Due(now time.Time) []executor.Arrival {
	items := s.Source.Due(now)
	for i := range items {
		items[i].Sampling = s.params
		if !s.params.IsGreedy() {
			items[i].Sampling.Seed = s.seedBase + items[i].ID
		}
		items[i].LogitBias, items[i].StopTokenIDs = s.bias, s.stopIDs
	}
	return items
}

// serveCPU runs reqs on in-process ranks of the native CPU engine (tiny
// preset) and returns every request's output by id.
func serveCPU(t *testing.T, reqs []workload.Request, ranks int, overlap, chunked bool, params bridge.SamplingParams) map[uint64][]int32 {
	t.Helper()
	return serveCPUWith(t, reqs, cpuRun{ranks: ranks, overlap: overlap, chunked: chunked, pages: 128,
		src: seededSource{params: params, seedBase: 500}})
}

// cpuRun is one serveCPUWith configuration: pages per rank (few force
// recompute preemption), the source's sampling settings, and whether every
// request must generate its max_new_tokens (no stop token ids).
type cpuRun struct {
	ranks            int
	overlap, chunked bool
	pages            int
	src              seededSource
}

func serveCPUWith(t *testing.T, reqs []workload.Request, c cpuRun) map[uint64][]int32 {
	t.Helper()
	ranks, overlap, chunked := c.ranks, c.overlap, c.chunked
	sc := scheduler.Config{MaxBatchSize: 8, MaxNumTokens: 256, ChunkedContext: chunked, ChunkUnitSize: 8,
		Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true, LedgerBlockTokens: 8}
	if chunked {
		sc.MaxNumTokens = 24 // 40-token prompts in chunks
	}
	comms := nccl.NewLocalGroup(ranks, nccl.LocalOptions{Timeout: time.Minute})
	source := &c.src
	source.Source = executor.NewTraceSource(reqs, time.Now())
	execs := make([]*executor.Executor, ranks)
	for i := range execs {
		eng, err := nativeengine.Open(bridge.Config{Preset: "tiny", Seed: 1, NumPages: c.pages, TokensPerPage: 8})
		require.NoError(t, err)
		defer eng.Close()
		kv, err := kvpool.New(kvpool.Config{NumPages: c.pages, TokensPerPage: 8, AttentionDP: ranks > 1, AttentionDPRank: i})
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
	recomputed := 0
	for _, r := range results[0].Responses {
		require.Empty(t, r.Error)
		if len(c.src.stopIDs) == 0 {
			require.Len(t, r.Output, reqs[r.ID].MaxNewTokens)
		} else if len(r.Output) < reqs[r.ID].MaxNewTokens {
			require.True(t, r.Stopped, "request %d ended early without a stop", r.ID)
			require.Contains(t, c.src.stopIDs, r.Output[len(r.Output)-1], "request %d", r.ID)
		}
		recomputed += r.Recomputed
		out[r.ID] = r.Output
	}
	if c.pages < 64 && len(c.src.stopIDs) == 0 { // (stopped requests may leave room)
		require.Positive(t, recomputed, "a pool of %d pages preempted nothing", c.pages)
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

// TestLogitsProcessorsCPUEngine: the penalties, min_p, logit bias and stop
// token ids give the same tokens on 1 and 2 ranks, in both loops, chunked
// or not and under recompute preemption, greedy and sampled; and each of
// them changes what is generated.
func TestLogitsProcessorsCPUEngine(t *testing.T) {
	var reqs []workload.Request
	for i := range 6 {
		reqs = append(reqs, workload.Request{Index: i, Prompt: workload.AppendBlockTokens(nil, uint64(300+i), 40, 512, 3),
			MaxNewTokens: 12})
	}
	sets := []struct {
		name string
		src  seededSource
	}{
		{"greedy penalties", seededSource{params: bridge.SamplingParams{PresencePenalty: 1.5, FrequencyPenalty: 0.7, RepetitionPenalty: 1.3}}},
		{"sampled penalties and min_p", seededSource{params: bridge.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.9,
			MinP: 0.1, PresencePenalty: -0.5, FrequencyPenalty: 1, RepetitionPenalty: 0.8}, seedBase: 500}},
		{"greedy logit bias", seededSource{bias: []bridge.TokenBias{{ID: 7, Bias: 30}, {ID: 9, Bias: 5}}}},
		{"sampled stop token ids", seededSource{params: bridge.SamplingParams{Temperature: 1.5, Seed: 1}, seedBase: 500,
			stopIDs: []int32{11, 12, 13, 14, 15, 16, 17, 18}}},
	}
	for _, set := range sets {
		t.Run(set.name, func(t *testing.T) {
			run := func(ranks int, overlap, chunked bool, pages int) map[uint64][]int32 {
				return serveCPUWith(t, reqs, cpuRun{ranks: ranks, overlap: overlap, chunked: chunked, pages: pages, src: set.src})
			}
			ref := run(1, false, true, 128)
			require.Equal(t, ref, run(2, true, true, 128), "2 ranks, overlap loop")
			require.Equal(t, ref, run(2, false, false, 128), "2 ranks, unchunked")
			require.Equal(t, ref, run(1, false, true, 24), "1 rank, recompute preemption")
			require.Equal(t, ref, run(2, true, true, 16), "2 ranks, overlap loop, recompute preemption")
			plain := set.src
			plain.params = bridge.SamplingParams{Temperature: set.src.params.Temperature, TopK: set.src.params.TopK,
				TopP: set.src.params.TopP}
			plain.bias, plain.stopIDs = nil, nil
			without := serveCPUWith(t, reqs, cpuRun{ranks: 1, chunked: true, pages: 128, src: plain})
			require.NotEqual(t, without, ref, "the processors changed nothing")
		})
	}
}
