package executor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBalanceAdd is the balance rule on hand-made iterations: mean/max of
// the ranks' tokens, averaged over iterations with a token; the
// speed-of-light time weighs each iteration's time by it.
func TestBalanceAdd(t *testing.T) {
	var b balance
	b.add(10, 300, 200, 2) // ranks 200 and 100: 0.75
	b.add(4, 0, 0, 2)      // only padding: time counts, no balance
	b.add(6, 8, 4, 2)      // 4 and 4: 1
	require.Equal(t, int64(2), b.n)
	require.InDelta(t, 1.75, b.tokenSum, 1e-12)
	require.InDelta(t, 20.0, b.forwardMS, 1e-12)
	require.InDelta(t, 10*0.75+6*1.0, b.solMS, 1e-12)
	require.InDelta(t, 0.75, tokenBalance([]int64{200, 100}), 1e-12)
	require.Zero(t, tokenBalance([]int64{0, 0}))
	require.Zero(t, tokenBalance(nil))
}

// TestTokenBalance (issue 25, item 3): under attention DP every rank's
// record of a forward carries the token balance of that forward, mean/max
// of the ranks' real tokens (ctx_tokens + gen_tokens of their records of
// the same iteration); rank 0's result averages it, and its
// speed-of-light time is Σ fleet time × balance, in both loops.
func TestTokenBalance(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		const ranks = 3
		f := runTimedFleet(t, sampleRequests(t, 24, 0.05), overlap)
		// Every rank's tokens per iteration, from its own records.
		tokens := map[int64][]int64{}
		balanceOf := map[int64][]*float64{}
		for rank, w := range f.iterLog {
			for _, line := range w.lines {
				var rec IterRecord
				require.NoError(t, json.Unmarshal(line, &rec))
				if rec.DeviceMS == nil {
					require.Nil(t, rec.TokenBalance, "no forward, no balance")
					continue
				}
				if tokens[rec.Iter] == nil {
					tokens[rec.Iter] = make([]int64, ranks)
				}
				tokens[rec.Iter][rank] = int64(rec.CtxTokens + rec.GenTokens)
				balanceOf[rec.Iter] = append(balanceOf[rec.Iter], rec.TokenBalance)
			}
		}
		var sum, sol float64
		n := 0
		for it, tk := range tokens {
			want := tokenBalance(tk)
			require.Len(t, balanceOf[it], ranks, "iteration %d: a record on every rank", it)
			for _, got := range balanceOf[it] {
				if want == 0 {
					require.Nil(t, got)
					continue
				}
				require.NotNil(t, got, "iteration %d (overlap %v)", it, overlap)
				require.InDelta(t, want, *got, 1e-3, "iteration %d (overlap %v): tokens %v", it, overlap, tk)
			}
			if want > 0 {
				sum += want
				sol += 5 * want // the slowest rank (2) takes 5 ms
				n++
			}
		}
		require.Greater(t, n, 3, "forwards with tokens")
		res := f.results[0]
		require.Equal(t, int64(n), res.BalanceIterations)
		require.InDelta(t, sum/float64(n), res.TokenBalance, 1e-9)
		require.Less(t, res.TokenBalance, 1.0, "the sample's ranks are not balanced")
		require.InDelta(t, 5*float64(len(tokens)), res.ForwardMS, 1e-6, "every processed forward took 5 ms")
		require.InDelta(t, sol, res.SOLForwardMS, 1e-6)
	}
}
