package executor

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/workload"
)

// lazy is an arrival whose prompt is made only on demand; made counts the
// syntheses.
func lazy(id uint64, n, maxNew int, made *[]uint64) Arrival {
	full := arrival(id, min(n, 400), maxNew)
	return Arrival{ID: id, MaxNewTokens: maxNew, PromptLen: n, Synthesize: func() []int32 {
		*made = append(*made, id)
		return full.Prompt
	}}
}

// Issue 9 defect 2: rank 0 rejects an arrival that can never fit from its
// lengths, before its tokens exist; the rejection is answered (Rank NoRank)
// even when it is the last thing the source produces, and what fits runs.
func TestScreenRejectsBeforeSynthesis(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		var made []uint64
		// The last arrivals come long after the others finished, and all
		// are rejected: nothing else keeps the fleet busy in that iteration.
		script := make([][]Arrival, 50)
		script[0] = []Arrival{lazy(0, 40, 4, &made), lazy(1, 1<<40, 4, &made), lazy(2, 30, 3, &made)}
		script[49] = []Arrival{lazy(3, 1<<33, 1, &made), lazy(4, 100, math.MaxInt, &made)}
		src := &scriptSource{byIter: script}
		f := &fleet{ranks: 2, overlap: overlap, pages: 32, source: src} // 256 tokens per rank
		f.run(t)
		f.requireNoErrors(t)
		f.requireEqualTraces(t)
		require.ElementsMatch(t, []uint64{0, 2}, made, "only the requests that fit are synthesised")
		got := map[uint64]Response{}
		for _, r := range f.results[0].Responses {
			got[r.ID] = r
		}
		require.Len(t, got, 5, "every request is answered")
		require.Empty(t, got[0].Error)
		require.Len(t, got[0].Output, 4)
		require.Len(t, got[2].Output, 3)
		require.Contains(t, got[1].Error, "prompt of 1099511627776 tokens + max_new_tokens 4 exceeds the int32 token range")
		require.Contains(t, got[3].Error, "exceeds the int32 token range")
		require.Contains(t, got[4].Error, "max_new_tokens 9223372036854775807 exceeds the int32 token range")
		for _, id := range []uint64{1, 3, 4} {
			require.Equal(t, NoRank, got[id].Rank, "request %d was never routed", id)
			require.GreaterOrEqual(t, got[id].FinishUnixNS, got[id].ArrivalUnixNS)
		}
	}
}

// Issue 9 defect 13: the routing fields travel in the arrival broadcast,
// and every rank routes with them (targets are honoured by the default
// router while the target has room).
func TestArrivalRoutingReachesTheRouter(t *testing.T) {
	items := []Arrival{
		{ID: 3, ArrivalUnixNS: 42, MaxNewTokens: 5, ConversationID: "c", Prompt: []int32{1, 2, 3},
			Routing: workload.Routing{AffinityID: "P", HasRank: true, Rank: 3, Strict: true}},
		{ID: 4, MaxNewTokens: 1, Prompt: []int32{7}, Routing: workload.Routing{HasRank: true}},
		{ID: 5, MaxNewTokens: 1, Prompt: []int32{8}, Routing: workload.Routing{AffinityID: "Q"}},
	}
	got, err := decodeArrivals(encodeArrivals(items), len(items))
	require.NoError(t, err)
	require.Equal(t, items, materialized(got))

	var reqs []Arrival
	for i := range 6 {
		a := arrival(uint64(i), 20, 3)
		a.Routing = workload.Routing{HasRank: true, Rank: 1, Strict: i%2 == 0}
		reqs = append(reqs, a)
	}
	f := &fleet{ranks: 2, source: allAtOnce(reqs...)}
	f.run(t)
	f.requireNoErrors(t)
	f.requireEqualTraces(t)
	require.Len(t, f.results[0].Responses, 6)
	for _, r := range f.results[0].Responses {
		require.Empty(t, r.Error)
		require.Equal(t, 1, r.Rank, "request %d targets rank 1", r.ID)
	}

	// A rejection before routing keeps its NoRank through the response gather.
	rb, err := decodeResponseBatch(responseBatch{Responses: []Response{{ID: 9, Rank: NoRank, Error: "x"}}}.encode())
	require.NoError(t, err)
	require.Equal(t, NoRank, rb.Responses[0].Rank)
}
