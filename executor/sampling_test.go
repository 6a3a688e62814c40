package executor

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
)

// samplingSource gives every arrival of a trace source sampling parameters
// with a per-request seed (seedBase + id).
type samplingSource struct {
	Source
	params   bridge.SamplingParams
	seedBase uint64
}

func (s *samplingSource) Due(now time.Time) []Arrival {
	items := s.Source.Due(now)
	for i := range items {
		items[i].Sampling = s.params
		items[i].Sampling.Seed = s.seedBase + items[i].ID
	}
	return items
}

var testSampling = bridge.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.9}

// A sampled request's tokens depend only on its own prompt, parameters and
// seed: identical on 1 and 4 ranks, in both loops, with and without recompute
// preemptions; other seeds give other tokens, and sampling is not greedy.
func TestSamplingOutputsInvariant(t *testing.T) {
	reqs := longOutputRequests(8, 40, 40)
	run := func(ranks, pages int, overlap bool, seedBase uint64) (*fleet, string) {
		f := &fleet{ranks: ranks, reqs: reqs, pages: pages, overlap: overlap,
			source: &samplingSource{Source: NewTraceSource(reqs, time.Now()), params: testSampling, seedBase: seedBase}}
		f.run(t)
		f.requireNoErrors(t)
		if ranks > 1 {
			f.requireEqualTraces(t)
		}
		return f, f.digest(t)
	}
	_, ref := run(1, 512, false, 1000)
	for _, overlap := range []bool{false, true} {
		_, d := run(4, 512, overlap, 1000)
		require.Equal(t, ref, d, "4 ranks, overlap %v", overlap)
		// Pools barely larger than the longest request (80 tokens, 10 pages).
		for ranks, pages := range map[int]int{1: 24, 4: 12} {
			tight, d := run(ranks, pages, overlap, 1000)
			recomputed := 0
			for _, r := range tight.results[0].Responses {
				recomputed += r.Recomputed
			}
			require.Positive(t, recomputed, "the tight pool should force recompute (ranks %d, overlap %v)", ranks, overlap)
			require.Equal(t, ref, d, "tight pool, ranks %d, overlap %v", ranks, overlap)
		}
	}
	_, other := run(1, 512, false, 2000)
	require.NotEqual(t, ref, other, "other seeds must draw other tokens")
	greedy := &fleet{ranks: 1, reqs: reqs, pages: 512}
	greedy.run(t)
	greedy.requireNoErrors(t)
	require.NotEqual(t, ref, greedy.digest(t), "sampling at temperature 0.8 equals greedy decoding")
	// Temperature 0 with the other fields set is greedy decoding.
	zeroT := &fleet{ranks: 2, reqs: reqs, pages: 512, source: &samplingSource{Source: NewTraceSource(reqs, time.Now()),
		params: bridge.SamplingParams{TopK: 5, TopP: 0.5}, seedBase: 7}}
	zeroT.run(t)
	zeroT.requireNoErrors(t)
	require.Equal(t, greedy.digest(t), zeroT.digest(t))
}

func TestArrivalPayloadSampling(t *testing.T) {
	items := []Arrival{
		{ID: 1, MaxNewTokens: 3, Prompt: []int32{4, 5}, Sampling: bridge.SamplingParams{Temperature: 0.7, TopK: 40, TopP: 0.95, Seed: math.MaxUint64}},
		{ID: 2, MaxNewTokens: 3, Prompt: []int32{6}},
		{ID: 3, MaxNewTokens: 3, Prompt: []int32{7}, StopAtEOS: true, Sampling: bridge.SamplingParams{Seed: 9}},
		{ID: 4, MaxNewTokens: 3, Prompt: []int32{8}, Sampling: bridge.SamplingParams{Temperature: 1, MinP: 0.05,
			PresencePenalty: -1.5, FrequencyPenalty: 0.25, RepetitionPenalty: 1.2},
			LogitBias: []bridge.TokenBias{{ID: 3, Bias: -100}, {ID: 70000, Bias: 2.5}}, StopTokenIDs: []int32{2, 9}},
		{ID: 6, MaxNewTokens: 3, Prompt: []int32{8}, Sampling: bridge.SamplingParams{PresencePenalty: 1}},
		{ID: 7, MaxNewTokens: 3, Prompt: []int32{8}, StopTokenIDs: []int32{0}},
	}
	got, err := decodeArrivals(encodeArrivals(items), len(items))
	require.NoError(t, err)
	got = materialized(got)
	require.Equal(t, items, got)
	// Invalid parameters are a broken invariant at rank 0 and a desync on
	// the receiving side.
	bad := []Arrival{{ID: 5, Prompt: []int32{1}, Sampling: bridge.SamplingParams{Temperature: -1}}}
	require.Panics(t, func() { encodeArrivals(bad) })
	payload := encodeArrivals([]Arrival{{ID: 5, Prompt: []int32{1}, Sampling: bridge.SamplingParams{Temperature: 1}}})
	// id, arrival, max_new, conv, affinity, flags, rank, temperature, top_k,
	// then top_p (0 here): its high byte 0x40 makes it 2.0.
	payload[8+8+4+4+4+1+4+4+4+3] = 0x40
	_, err = decodeArrivals(payload, 1)
	require.ErrorContains(t, err, "collective desync")
	require.ErrorContains(t, err, "top_p")
	// A processor field out of range on the wire is a desync too.
	payload = encodeArrivals([]Arrival{{ID: 5, Prompt: []int32{1}, Sampling: bridge.SamplingParams{MinP: 0.5}}})
	// ... flags, rank, then min_p (no sampling fields: temperature is 0
	// but MinP makes the sampling non-zero, so they are there).
	payload[8+8+4+4+4+1+4+20+3] = 0x40 // min_p 0.5 → 2.5
	_, err = decodeArrivals(payload, 1)
	require.ErrorContains(t, err, "min_p")
}

// Rank 0 rejects a request with invalid sampling parameters before the
// broadcast; the others are served.
func TestInvalidSamplingRejected(t *testing.T) {
	reqs := longOutputRequests(3, 16, 4)
	src := &badSamplingSource{Source: NewTraceSource(reqs, time.Now())}
	f := &fleet{ranks: 2, reqs: reqs, source: src}
	f.run(t)
	f.requireNoErrors(t)
	var rejected []uint64
	for _, r := range f.results[0].Responses {
		if r.Error != "" {
			require.Contains(t, r.Error, "sampling")
			rejected = append(rejected, r.ID)
		} else {
			require.Len(t, r.Output, 4)
		}
	}
	require.Equal(t, []uint64{1}, rejected)
}

type badSamplingSource struct{ Source }

func (s *badSamplingSource) Due(now time.Time) []Arrival {
	items := s.Source.Due(now)
	for i := range items {
		if items[i].ID == 1 {
			items[i].Sampling = bridge.SamplingParams{Temperature: 1, TopP: 3}
		}
	}
	return items
}
