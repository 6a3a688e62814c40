package executor

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
)

// logprobsSource asks every arrival for log-probabilities (top k = id % 4 · 5,
// so 0, 5, 10 and 15 all occur), over samplingSource's parameters.
type logprobsSource struct{ samplingSource }

func (s *logprobsSource) Due(now time.Time) []Arrival {
	items := s.samplingSource.Due(now)
	for i := range items {
		items[i].Logprobs, items[i].TopLogprobs = true, int(items[i].ID%4)*5
	}
	return items
}

// logprobsDigest hashes rank 0's log-probabilities in request order (bits).
func (f *fleet) logprobsDigest(t *testing.T) string {
	out := make([][]TokenLogprobs, len(f.reqs))
	for _, r := range f.results[0].Responses {
		require.Len(t, r.Logprobs, len(r.Output), "request %d", r.ID)
		out[r.ID] = r.Logprobs
	}
	h := sha256.New()
	for i, lps := range out {
		b := binary.LittleEndian.AppendUint64(nil, uint64(i))
		for _, lp := range lps {
			require.Len(t, lp.TopIDs, int(i%4)*5, "request %d", i)
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lp.Logprob))
			for j, id := range lp.TopIDs {
				b = binary.LittleEndian.AppendUint32(b, uint32(id))
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lp.TopLogprobs[j]))
			}
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Log-probabilities are extra output: the tokens are those of the same run
// without them, and they are bit-identical on 1 and 4 ranks, in both loops
// and under recompute preemption (the fake engine is batch-invariant, as
// the CPU engine is; tests/ checks the native one).
func TestLogprobsInvariant(t *testing.T) {
	reqs := longOutputRequests(8, 24, 24)
	run := func(ranks, pages int, overlap, lp bool) (*fleet, string, string) {
		src := samplingSource{Source: NewTraceSource(reqs, time.Now()), params: testSampling, seedBase: 1000}
		f := &fleet{ranks: ranks, reqs: reqs, pages: pages, overlap: overlap, source: &src}
		if lp {
			f.source = &logprobsSource{src}
		}
		f.run(t)
		f.requireNoErrors(t)
		if !lp {
			for _, r := range f.results[0].Responses {
				require.Nil(t, r.Logprobs, "request %d did not ask for logprobs", r.ID)
			}
			return f, f.digest(t), ""
		}
		return f, f.digest(t), f.logprobsDigest(t)
	}
	_, tokens, _ := run(1, 512, false, false)
	_, withLp, ref := run(1, 512, false, true)
	require.Equal(t, tokens, withLp, "asking for logprobs changed the tokens")
	for _, overlap := range []bool{false, true} {
		_, d, lp := run(4, 512, overlap, true)
		require.Equal(t, tokens, d, "4 ranks, overlap %v", overlap)
		require.Equal(t, ref, lp, "4 ranks, overlap %v", overlap)
		tight, d, lp := run(4, 9, overlap, true)
		recomputed := 0
		for _, r := range tight.results[0].Responses {
			recomputed += r.Recomputed
		}
		require.Positive(t, recomputed, "the tight pool should force recompute (overlap %v)", overlap)
		require.Equal(t, tokens, d, "tight pool, overlap %v", overlap)
		require.Equal(t, ref, lp, "tight pool, overlap %v", overlap)
	}
}

func TestLogprobsPayloads(t *testing.T) {
	items := []Arrival{
		{ID: 1, MaxNewTokens: 3, Prompt: []int32{4, 5}, Logprobs: true, TopLogprobs: bridge.MaxLogprobs},
		{ID: 2, MaxNewTokens: 3, Prompt: []int32{6}, Logprobs: true},
		{ID: 3, MaxNewTokens: 3, Prompt: []int32{7}},
	}
	got, err := decodeArrivals(encodeArrivals(items), len(items))
	require.NoError(t, err)
	require.Equal(t, items, materialized(got))
	// Without logprobs the payload is what it was before they existed.
	plain := encodeArrivals(items[2:])
	require.Len(t, plain, 8+8+4+4+4+1+4+4+4)
	// A count beyond MaxLogprobs on the wire is a desync.
	payload := encodeArrivals(items[1:2])
	payload[8+8+4+4+4+1+4] = bridge.MaxLogprobs + 1
	_, err = decodeArrivals(payload, 1)
	require.ErrorContains(t, err, "top_logprobs")

	lp := TokenLogprobs{Logprob: -0.25, TopIDs: []int32{3, 1}, TopLogprobs: []float32{-0.25, -2}}
	rb := responseBatch{DeviceUS: 5,
		Deltas: []TokenDelta{{ID: 1, Token: 3, Logprobs: &lp}, {ID: 2, Token: 4}, {ID: 1, Token: 1, Logprobs: &TokenLogprobs{Logprob: float32(math.Inf(-1))}}},
		Responses: []Response{
			{ID: 1, Output: []int32{3, 1}, Logprobs: []TokenLogprobs{lp, {Logprob: -3}}, Stopped: true},
			{ID: 2, Output: []int32{4}, Error: "x"},
		}}
	back, err := decodeResponseBatch(rb.encode())
	require.NoError(t, err)
	require.Equal(t, rb, back)
	// Without logprobs the encoding has no trailer and no flag.
	rb2 := responseBatch{Deltas: []TokenDelta{{ID: 2, Token: 4}}, Responses: []Response{{ID: 2, Output: []int32{4}}}}
	back, err = decodeResponseBatch(rb2.encode())
	require.NoError(t, err)
	require.Equal(t, rb2, back)
	b := rb.encode()
	_, err = decodeResponseBatch(b[:len(b)-3])
	require.ErrorContains(t, err, "collective desync")
}
