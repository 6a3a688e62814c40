//go:build native

package tests

import (
	"cmp"
	"io"
	"math"
	"slices"
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
	// logprobs asks every request for its tokens' log-probabilities with
	// the top topLogprobs.
	logprobs    bool
	topLogprobs int
}

func (s *seededSource) Due(now time.Time) []executor.Arrival {
	items := s.Source.Due(now)
	for i := range items {
		items[i].Sampling = s.params
		if !s.params.IsGreedy() {
			items[i].Sampling.Seed = s.seedBase + items[i].ID
		}
		items[i].LogitBias, items[i].StopTokenIDs = s.bias, s.stopIDs
		items[i].Logprobs, items[i].TopLogprobs = s.logprobs, s.topLogprobs
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
	// logprobs, when set, receives every request's log-probabilities.
	logprobs map[uint64][]executor.TokenLogprobs
	// engineThread runs each rank's loop on its engine's thread
	// (executor.Config.EngineThread); iterLogs, when set, receives each
	// rank's iteration log.
	engineThread bool
	iterLogs     []io.Writer
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
		cfg := executor.Config{Rank: i, Ranks: ranks, Scheduler: sc, Overlap: overlap,
			MaxIdleSleep: time.Millisecond, EngineThread: c.engineThread}
		if c.iterLogs != nil {
			cfg.IterLog = c.iterLogs[i]
		}
		execs[i], err = executor.New(cfg, d)
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
		if c.logprobs != nil {
			if c.src.logprobs {
				require.Len(t, r.Logprobs, len(r.Output), "request %d", r.ID)
			}
			c.logprobs[r.ID] = r.Logprobs
		}
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

// requireLogprobsOfRow checks an engine's log-probabilities of one row
// against a log_softmax of the whole row computed here with the standard
// library in float64: the token's and each top entry's within 1e-5, the top
// ids the largest logits in order (ties: lower id).
func requireLogprobsOfRow(t *testing.T, row []float32, tok int32, lp float32, ids []int32, lps []float32) {
	t.Helper()
	m := math.Inf(-1)
	for _, l := range row {
		m = math.Max(m, float64(l))
	}
	sum := 0.0
	for _, l := range row {
		sum += math.Exp(float64(l) - m)
	}
	lse := m + math.Log(sum)
	require.InDelta(t, float64(row[tok])-lse, float64(lp), 1e-5, "token %d", tok)
	order := make([]int32, len(row))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(row[b], row[a]) })
	require.Equal(t, order[:len(ids)], ids, "top ids")
	for j, id := range ids {
		require.InDelta(t, float64(row[id])-lse, float64(lps[j]), 1e-5, "top %d (id %d)", j, id)
	}
}

// TestLogprobsCPUEngine: log-probabilities on the CPU engine are
// bit-identical on 1 and 2 ranks, in both loops, chunked or not and under
// recompute preemption, and change no token; against the logits of the
// same positions recomputed by a plain engine step, they are a log_softmax
// of the raw logits (before the penalties and the temperature).
func TestLogprobsCPUEngine(t *testing.T) {
	var reqs []workload.Request
	for i := range 6 {
		reqs = append(reqs, workload.Request{Index: i, Prompt: workload.AppendBlockTokens(nil, uint64(300+i), 40, 512, 3),
			MaxNewTokens: 10})
	}
	src := seededSource{params: bridge.SamplingParams{Temperature: 0.8, TopK: 40, PresencePenalty: 1, RepetitionPenalty: 1.2},
		seedBase: 500, logprobs: true, topLogprobs: 5}
	run := func(ranks int, overlap, chunked bool, pages int, src seededSource) (map[uint64][]int32, map[uint64][]executor.TokenLogprobs) {
		lps := map[uint64][]executor.TokenLogprobs{}
		out := serveCPUWith(t, reqs, cpuRun{ranks: ranks, overlap: overlap, chunked: chunked, pages: pages, src: src, logprobs: lps})
		return out, lps
	}
	ref, refLp := run(1, false, true, 128, src)
	plain := src
	plain.logprobs, plain.topLogprobs = false, 0
	tokens, none := run(1, false, true, 128, plain)
	require.Equal(t, tokens, ref, "asking for logprobs changed the tokens")
	for id, l := range none {
		require.Nil(t, l, "request %d did not ask for logprobs", id)
	}
	for _, c := range []struct {
		name             string
		ranks, pages     int
		overlap, chunked bool
	}{
		{"2 ranks, overlap loop", 2, 128, true, true},
		{"2 ranks, unchunked", 2, 128, false, false},
		{"1 rank, recompute preemption", 1, 24, false, true},
		{"2 ranks, overlap loop, recompute preemption", 2, 16, true, true},
	} {
		out, lps := run(c.ranks, c.overlap, c.chunked, c.pages, src)
		require.Equal(t, ref, out, c.name)
		require.Equal(t, len(refLp), len(lps), c.name)
		for id, want := range refLp {
			got := lps[id]
			require.Len(t, got, len(want), "%s: request %d", c.name, id)
			for j := range want {
				require.Equal(t, math.Float32bits(want[j].Logprob), math.Float32bits(got[j].Logprob), "%s: request %d token %d", c.name, id, j)
				require.Equal(t, want[j].TopIDs, got[j].TopIDs, "%s: request %d token %d", c.name, id, j)
				for k := range want[j].TopLogprobs {
					require.Equal(t, math.Float32bits(want[j].TopLogprobs[k]), math.Float32bits(got[j].TopLogprobs[k]), "%s: request %d token %d", c.name, id, j)
				}
			}
		}
	}
	// Request 0's positions recomputed from scratch (one prefill each) with
	// the raw logits: the reported values are their log_softmax.
	eng, err := nativeengine.Open(bridge.Config{Preset: "tiny", Seed: 1, NumPages: 8, TokensPerPage: 8})
	require.NoError(t, err)
	defer eng.Close()
	seq := append([]int32(nil), reqs[0].Prompt...)
	for j, tok := range ref[0] {
		var res bridge.StepResult
		require.NoError(t, eng.Step(&bridge.StepDesc{WantLogits: true, Seqs: []bridge.SeqStep{{Tokens: seq,
			BlockTable: []int32{0, 1, 2, 3, 4, 5, 6}, Sample: true}}}, &res))
		requireLogprobsOfRow(t, res.Logits, tok, refLp[0][j].Logprob, refLp[0][j].TopIDs, refLp[0][j].TopLogprobs)
		seq = append(seq, tok)
	}
}
