package executor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/workload"
)

// FuzzPayloads: the arrival broadcast's, the response gathers', the
// schedule check's, the rank states' and the cancellations' payloads from
// arbitrary bytes (a collective paired with the wrong one, a corrupt
// peer) decode or fail with an error, never panic and never allocate
// beyond what the bytes can hold; what decodes encodes to a payload that
// decodes to the same (byte for byte once encoded again).
func FuzzPayloads(f *testing.F) {
	lp := TokenLogprobs{Logprob: -0.5, TopIDs: []int32{3, 9}, TopLogprobs: []float32{-0.5, -2}}
	f.Add(encodeArrivals([]Arrival{
		{ID: 1, MaxNewTokens: 4, Prompt: []int32{1, 2, 3}, ConversationID: "c", StopAtEOS: true,
			Routing: workload.Routing{HasRank: true, Rank: 1, AffinityID: "a"}},
		{ID: 2, MaxNewTokens: 3, Prompt: []int32{7}, Logprobs: true, TopLogprobs: 2, PromptLogprobs: true,
			PromptTopLogprobs: 5, Priority: -3, MinTokens: 1, AllowedTokenIDs: []int32{4, 5}, BadWords: [][]int32{{6}},
			Guide: "a+", Sampling: bridge.SamplingParams{Temperature: 0.5, TopP: 0.9, Seed: 3, MinP: 0.1},
			LogitBias: []bridge.TokenBias{{ID: 2, Bias: 1}}, StopTokenIDs: []int32{9}},
	}), uint8(2))
	f.Add(responseBatch{DeviceUS: 5, Tokens: 3,
		Deltas: []TokenDelta{{ID: 1, Token: 3, Logprobs: &lp, PromptLogprobs: []TokenLogprobs{lp}}, {ID: 2, Token: 4}},
		Responses: []Response{{ID: 1, Output: []int32{3}, Logprobs: []TokenLogprobs{lp}, PromptLogprobs: []TokenLogprobs{{Logprob: -1, Rank: 7}},
			Stopped: true}, {ID: 2, Rank: NoRank, Error: "x"}}}.encode(), uint8(0))
	f.Add([]byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		if items, err := decodeArrivals(b, int(n%4)); err == nil {
			enc := encodeArrivals(materialized(items))
			again, err := decodeArrivals(enc, len(items))
			require.NoError(t, err)
			require.Equal(t, enc, encodeArrivals(materialized(again))) // bytes: NaN bits compare equal
		}
		if s, err := decodeSummary(b); err == nil {
			again, err := decodeSummary(s.encode())
			require.NoError(t, err)
			require.Equal(t, s.encode(), again.encode())
		}
		if _, err := decodeRankState(b); err != nil && len(b)%8 == 0 && len(b) >= 8 && len(b) <= 8*RankStateLen {
			t.Fatalf("a rank state of %d bytes refused: %v", len(b), err)
		}
		if ids, err := decodeIDs(b, int(n)); err == nil {
			require.Equal(t, b, encodeIDs(ids))
		}
		if rb, err := decodeResponseBatch(b); err == nil {
			enc := rb.encode()
			again, err := decodeResponseBatch(enc)
			require.NoError(t, err)
			require.Equal(t, enc, again.encode())
		}
	})
}
