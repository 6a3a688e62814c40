package executor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

func TestServesEveryRequestAndDigestIndependentOfRanks(t *testing.T) {
	reqs := sampleRequests(t, 24, 0.05)
	var digests []string
	for _, c := range []struct {
		ranks   int
		overlap bool
	}{{1, false}, {2, false}, {4, false}, {1, true}, {2, true}, {4, true}} {
		ranks := c.ranks
		f := &fleet{ranks: ranks, reqs: reqs, overlap: c.overlap}
		f.run(t)
		f.requireNoErrors(t)
		if ranks > 1 {
			f.requireEqualTraces(t)
		}
		digests = append(digests, f.digest(t))
		for i, kv := range f.kvs {
			require.NoError(t, kv.CheckInvariants(), "rank %d", i)
			require.Equal(t, kv.TotalPages(), kv.FreePages(), "rank %d leaked pages", i)
		}
		// Every rank exits in the same iteration.
		for _, r := range f.results {
			require.Equal(t, f.results[0].Iterations, r.Iterations)
		}
	}
	for i := range digests {
		require.Equal(t, digests[0], digests[i], "run %d", i)
	}
}

func TestRecomputeUnderPressureKeepsOutputs(t *testing.T) {
	reqs := longOutputRequests(8, 40, 40)
	roomy := &fleet{ranks: 2, reqs: reqs, pages: 512}
	roomy.run(t)
	roomy.requireNoErrors(t)
	// A pool barely larger than the longest request forces preemption.
	for _, overlap := range []bool{false, true} {
		tight := &fleet{ranks: 2, reqs: reqs, pages: 24, overlap: overlap}
		tight.run(t)
		tight.requireNoErrors(t)
		tight.requireEqualTraces(t)
		recomputed := 0
		for _, r := range tight.results[0].Responses {
			recomputed += r.Recomputed
		}
		require.Positive(t, recomputed, "the tight pool should force recompute preemptions (overlap %v)", overlap)
		require.Equal(t, roomy.digest(t), tight.digest(t), "overlap %v", overlap)
		for i, kv := range tight.kvs {
			require.NoError(t, kv.CheckInvariants(), "rank %d", i)
			require.Equal(t, kv.TotalPages(), kv.FreePages(), "rank %d leaked pages", i)
		}
	}
}

func TestNeverFittingRequestIsRejectedAtOnce(t *testing.T) {
	reqs := sampleRequests(t, 4, 0.05)
	big := workload.Request{Index: 4, Prompt: make([]int32, 250), MaxNewTokens: 10}
	reqs = append(reqs, big)
	f := &fleet{ranks: 2, reqs: reqs, pages: 32} // 256 tokens per rank
	f.run(t)
	f.requireNoErrors(t)
	var rejected []Response
	for _, r := range f.results[0].Responses {
		if r.Error != "" {
			rejected = append(rejected, r)
		}
	}
	require.Len(t, rejected, 1)
	require.Equal(t, uint64(4), rejected[0].ID)
	require.Contains(t, rejected[0].Error, "can never fit the KV pool")
	require.Len(t, f.results[0].Responses, 5)
}

func TestIdleRankIsPaddedWithDummy(t *testing.T) {
	// One request on two ranks: rank 1 has nothing, so it runs dummies and
	// the fleet still makes progress.
	reqs := sampleRequests(t, 1, 0.05)
	f := &fleet{ranks: 2, reqs: reqs}
	f.run(t)
	f.requireNoErrors(t)
	f.requireEqualTraces(t)
	f.digest(t)
	dummies := 0
	for _, line := range f.iterLog[1].lines {
		var rec IterRecord
		require.NoError(t, json.Unmarshal(line, &rec))
		if rec.ADPDummy {
			dummies++
			require.True(t, rec.CanQueue)
		}
	}
	require.Positive(t, dummies)
	require.Equal(t, f.kvs[1].TotalPages(), f.kvs[1].FreePages())
}

func TestIterationLogRecords(t *testing.T) {
	reqs := sampleRequests(t, 4, 0.05)
	f := &fleet{ranks: 1, reqs: reqs}
	f.run(t)
	f.requireNoErrors(t)
	lines := f.iterLog[0].lines
	require.Len(t, lines, int(f.results[0].Iterations))
	ctxTokens := 0
	for i, line := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(line, &rec))
		require.EqualValues(t, i, rec["iter"])
		require.EqualValues(t, 1, rec["v"])
		for _, k := range []string{"rank", "dp_rank", "cp_rank", "ts_unix_ms", "host_ms", "device_ms", "wait_ms",
			"can_queue", "ctx_request_ids", "ctx_kv_start", "ctx_chunk_tokens", "cost_s", "kv_util", "max_num_tokens"} {
			require.Contains(t, rec, k)
		}
		ctxTokens += int(rec["ctx_tokens"].(float64))
	}
	prompt := 0
	for _, r := range reqs {
		prompt += r.Len()
	}
	require.Equal(t, prompt, ctxTokens, "every prompt token is prefilled exactly once without preemption")
}

func TestArrivalPayloadRoundTripAndDesync(t *testing.T) {
	items := []Arrival{{ID: 3, ArrivalUnixNS: 42, MaxNewTokens: 5, ConversationID: "c", Prompt: []int32{1, 2, 3}},
		{ID: 9, Prompt: []int32{7}}}
	got, err := decodeArrivals(encodeArrivals(items), 2)
	require.NoError(t, err)
	// Decoded prompts are lazy: the tokens are made when a rank admits the
	// request (only the owning rank under attention DP).
	require.Nil(t, got[0].Prompt)
	require.Equal(t, 3, got[0].promptLen())
	got = materialized(got)
	require.Equal(t, items[0], got[0])
	require.Equal(t, items[1].Prompt, got[1].Prompt)
	_, err = decodeArrivals([]byte{1, 2, 3}, 1)
	require.ErrorContains(t, err, "collective desync")
	_, err = decodeResponseBatch([]byte{1, 2, 3})
	require.ErrorContains(t, err, "collective desync")
	_, err = decodeRankState(make([]byte, 8*14))
	require.ErrorContains(t, err, "collective desync")
	s, err := decodeRankState(RankState{Rank: 1, ActiveRequests: 2}.encode()[:16])
	require.NoError(t, err)
	require.Equal(t, int64(-1), s.StatsIter, "missing trailing fields take their defaults")
}

func TestResetForRecompute(t *testing.T) {
	r := newRequest(Arrival{ID: 1, Prompt: []int32{1, 2, 3, 4}, MaxNewTokens: 10})
	r.State = scheduler.GenerationInProgress
	r.ContextPosition = 4
	r.output = []int32{5, 6, 7}
	r.Generated = 3
	r.resetForRecompute()
	require.Equal(t, []int32{1, 2, 3, 4, 5, 6, 7}, r.Tokens)
	require.Equal(t, 7, r.PromptLen)
	require.Equal(t, 7, r.MaxNewTokens)
	require.Equal(t, scheduler.ContextInit, r.State)
	require.Zero(t, r.ContextPosition)
	require.Zero(t, r.Generated)
	require.Equal(t, scheduler.NoBatchIndex, r.BatchIndex)
	require.Equal(t, 1, r.recomputed)
}

// longOutputRequests builds n requests of prompt p tokens (sharing nothing)
// that each generate g tokens.
func longOutputRequests(n, p, g int) []workload.Request {
	var out []workload.Request
	for i := 0; i < n; i++ {
		prompt := workload.AppendBlockTokens(nil, uint64(100+i), p, 512, 3)
		out = append(out, workload.Request{Index: i, Prompt: prompt, MaxNewTokens: g})
	}
	return out
}

// E-19: in the overlap loop every iteration with a forward gets one record
// with its own device time, written one iteration late; records of all
// iterations are present.
func TestOverlapIterationRecords(t *testing.T) {
	reqs := longOutputRequests(3, 16, 6)
	f := &fleet{ranks: 1, reqs: reqs, overlap: true}
	f.run(t)
	f.requireNoErrors(t)
	seen := map[int64]bool{}
	forwards := 0
	for _, line := range f.iterLog[0].lines {
		var rec IterRecord
		require.NoError(t, json.Unmarshal(line, &rec))
		require.False(t, seen[rec.Iter], "iteration %d logged twice", rec.Iter)
		seen[rec.Iter] = true
		if rec.CanQueue {
			require.NotNil(t, rec.DeviceMS, "iteration %d ran a forward", rec.Iter)
			forwards++
		} else {
			require.Nil(t, rec.DeviceMS)
		}
	}
	require.Len(t, seen, int(f.results[0].Iterations))
	require.EqualValues(t, f.results[0].ForwardIterations, forwards)
}

// materialized decodes every lazy prompt of arrivals, as admit does.
func materialized(arrivals []Arrival) []Arrival {
	out := make([]Arrival, len(arrivals))
	for i, a := range arrivals {
		if a.Prompt == nil && a.Synthesize != nil {
			a.Prompt, a.Synthesize, a.PromptLen = a.Synthesize(), nil, 0
		}
		out[i] = a
	}
	return out
}
