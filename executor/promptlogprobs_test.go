package executor

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/workload"
)

// promptLogprobsSource asks every arrival for its prompt's
// log-probabilities (top k = 3) and, with outLogprobs, for its output's
// (top k = 3).
type promptLogprobsSource struct {
	Source
	outLogprobs bool
}

func (s *promptLogprobsSource) Due(now time.Time) []Arrival {
	items := s.Source.Due(now)
	for i := range items {
		items[i].PromptLogprobs, items[i].PromptTopLogprobs = !s.outLogprobs, 3
		if s.outLogprobs {
			items[i].PromptTopLogprobs = 0
			items[i].Logprobs, items[i].TopLogprobs = true, 3
		}
	}
	return items
}

// byID is rank 0's responses by request id.
func (f *fleet) byID(t *testing.T) map[uint64]Response {
	t.Helper()
	f.requireNoErrors(t)
	out := map[uint64]Response{}
	for _, r := range f.results[0].Responses {
		require.Empty(t, r.Error, "request %d", r.ID)
		out[r.ID] = r
	}
	require.Len(t, out, len(f.reqs))
	return out
}

// The prompt's log-probabilities are the model's own: a request whose
// prompt is an earlier request's prompt and output scores that output's
// tokens exactly as their generation did (log-probability and top 3, bit
// for bit), on 1 and 4 ranks, in both loops, under recompute preemption
// and with prefix reuse on (twins of one prompt: the second claims
// nothing, so every row is computed).
func TestPromptLogprobsScoreTheModelsOwnTokens(t *testing.T) {
	const out = 7
	gen := longOutputRequests(6, 19, out)
	g := &fleet{ranks: 1, reqs: gen}
	g.source = &promptLogprobsSource{Source: NewTraceSource(gen, time.Now()), outLogprobs: true}
	g.run(t)
	generated := g.byID(t)

	var scored []workload.Request
	for i := range gen {
		r := generated[uint64(i)]
		require.Len(t, r.Logprobs, out)
		p := append(slices.Clone(gen[i].Prompt), r.Output...)
		for range 2 { // twins: the second could reuse the first's prefix
			scored = append(scored, workload.Request{Index: len(scored), Prompt: p, MaxNewTokens: 16})
		}
	}
	for _, c := range []struct {
		ranks, pages int
		overlap      bool
		events       int
	}{{1, 256, false, 0}, {4, 256, true, 0}, {4, 256, false, 64}, {2, 9, true, 0}, {2, 9, false, 64}} {
		f := &fleet{ranks: c.ranks, pages: c.pages, overlap: c.overlap, events: c.events, reqs: scored}
		f.source = &promptLogprobsSource{Source: NewTraceSource(scored, time.Now())}
		f.run(t)
		got := f.byID(t)
		recomputed := 0
		for _, r := range got {
			recomputed += r.Recomputed
		}
		if c.pages < 16 {
			require.Positive(t, recomputed, "%+v: the tight pool should force recompute", c)
		}
		for id, r := range got {
			req := scored[id]
			require.Len(t, r.PromptLogprobs, len(req.Prompt)-1, "%+v: request %d", c, id)
			require.Zero(t, r.ReusedTokens, "%+v: request %d reused a prefix", c, id)
			for j, lp := range r.PromptLogprobs {
				require.Len(t, lp.TopIDs, 3)
				require.Positive(t, lp.Rank)
				if k := slices.Index(lp.TopIDs, req.Prompt[j+1]); k >= 0 {
					require.GreaterOrEqual(t, lp.Rank, int32(k+1), "a top-%d token's rank (ties count)", k+1)
				} else {
					require.Greater(t, lp.Rank, int32(3), "a token outside the top 3")
				}
			}
			want := generated[id/2].Logprobs
			tail := slices.Clone(r.PromptLogprobs[len(req.Prompt)-1-out:])
			for j := range tail {
				tail[j].Rank = 0 // generated tokens have none
			}
			require.Equal(t, want, tail, "%+v: request %d", c, id)
		}
	}
}

// Streaming, the prompt's log-probabilities ride the first token's delta
// (exactly once per request, even under recompute), not the response.
func TestPromptLogprobsStreamOnTheFirstToken(t *testing.T) {
	reqs := longOutputRequests(8, 21, 16)
	want := &fleet{ranks: 1, reqs: reqs}
	want.source = &promptLogprobsSource{Source: NewTraceSource(reqs, time.Now())}
	want.run(t)
	ref := want.byID(t)
	got := map[uint64][]TokenLogprobs{}
	var mu sync.Mutex
	f := &fleet{ranks: 2, pages: 9, overlap: true, reqs: reqs, onTokens: func(ds []TokenDelta) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			if d.PromptLogprobs != nil {
				_, twice := got[d.ID]
				require.False(t, twice, "request %d: prompt log-probabilities twice", d.ID)
				got[d.ID] = d.PromptLogprobs
			}
		}
	}}
	f.source = &promptLogprobsSource{Source: NewTraceSource(reqs, time.Now())}
	f.run(t)
	recomputed := 0
	for id, r := range f.byID(t) {
		require.Nil(t, r.PromptLogprobs, "request %d: streamed, the response has none", id)
		require.Equal(t, ref[id].PromptLogprobs, got[id], "request %d", id)
		recomputed += r.Recomputed
	}
	require.Positive(t, recomputed)
}

// A prompt of one token has no prompt log-probabilities; the wire carries
// them, and a bad top count on the wire is a desync.
func TestPromptLogprobsPayloads(t *testing.T) {
	items := []Arrival{
		{ID: 1, MaxNewTokens: 3, Prompt: []int32{4, 5}, PromptLogprobs: true, PromptTopLogprobs: bridge.MaxLogprobs},
		{ID: 2, MaxNewTokens: 3, Prompt: []int32{6}, PromptLogprobs: true, Logprobs: true, MinTokens: 1},
	}
	got, err := decodeArrivals(encodeArrivals(items), len(items))
	require.NoError(t, err)
	require.Equal(t, items, materialized(got))
	payload := encodeArrivals(items[:1])
	other := items[0]
	other.PromptTopLogprobs--
	at := -1 // the top count: the one byte the two payloads differ in
	for j, c := range encodeArrivals([]Arrival{other}) {
		if c != payload[j] {
			at = j
		}
	}
	require.Positive(t, at)
	payload[at] = bridge.MaxLogprobs + 1
	_, err = decodeArrivals(payload, 1)
	require.ErrorContains(t, err, "top_logprobs")

	lp := TokenLogprobs{Logprob: -0.5, TopIDs: []int32{9}, TopLogprobs: []float32{-0.1}}
	rb := responseBatch{Responses: []Response{
		{ID: 1, Output: []int32{3}, PromptLogprobs: []TokenLogprobs{lp, {Logprob: -7, Rank: 300}}},
		{ID: 2, Output: []int32{4}, Logprobs: []TokenLogprobs{{Logprob: -1}}, PromptLogprobs: []TokenLogprobs{}},
	}}
	back, err := decodeResponseBatch(rb.encode())
	require.NoError(t, err)
	require.Equal(t, rb, back)
	// On deltas: with and without the deltas' own log-probabilities.
	for _, withLp := range []bool{false, true} {
		rb := responseBatch{Deltas: []TokenDelta{{ID: 1, Token: 3}, {ID: 2, Token: 4, PromptLogprobs: []TokenLogprobs{lp, {Logprob: -2, Rank: 9}}},
			{ID: 3, Token: 5, PromptLogprobs: []TokenLogprobs{}}}}
		if withLp {
			rb.Deltas[0].Logprobs = &lp
		}
		b := rb.encode()
		back, err := decodeResponseBatch(b)
		require.NoError(t, err)
		require.Equal(t, rb, back)
		_, err = decodeResponseBatch(b[:len(b)-2])
		require.ErrorContains(t, err, "collective desync")
	}

	f := &fleet{ranks: 2, reqs: []workload.Request{{Index: 0, Prompt: []int32{7}, MaxNewTokens: 2}}}
	f.source = &promptLogprobsSource{Source: NewTraceSource(f.reqs, time.Now())}
	f.run(t)
	require.Nil(t, f.byID(t)[0].PromptLogprobs)
}
