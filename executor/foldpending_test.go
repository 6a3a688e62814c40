package executor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/workload"
)

// TestFoldedPendingResponses: in the overlap loop under attention DP the
// pending responses (C8) ride the response gather (C7, foldPending). On 3
// ranks with a rejection flushed as a pending response, the run with the
// fold and the run with C8 gathered on its own give the same answers, the
// same metrics and the same iteration logs on every rank (timings aside),
// with one gather fewer per iteration.
func TestFoldedPendingResponses(t *testing.T) {
	epoch := time.Unix(3_000_000, 0)
	sc := defaultSched()
	sc.ChunkedContext, sc.MaxNumTokens = false, 64
	var reqs []workload.Request
	for i := 0; i < 10; i++ {
		n := 4 + 3*i
		if i == 4 {
			n = 100 // over max_num_tokens without chunking: rejected at intake, answered through C8
		}
		a := arrival(uint64(i), n, 2+i%4)
		reqs = append(reqs, workload.Request{Index: i, Arrival: time.Duration(i/2) * 20 * time.Millisecond,
			Prompt: a.Prompt, MaxNewTokens: a.MaxNewTokens})
	}
	run := func(fold bool) (*rig, map[string]int) {
		unfoldPending = !fold
		defer func() { unfoldPending = false }()
		g := (&rig{n: 3, overlap: true, sc: sc, src: traceSource(epoch, reqs...), virtual: &epoch,
			wrapEng: func(_ int, e bridge.Engine) bridge.Engine { return &costEngine{Engine: e} }}).build(t)
		g.run()
		g.requireNoErrors(t)
		g.requireEqualTraces(t)
		names := map[string]int{}
		for _, e := range g.ranks[0].comm.Trace() {
			names[e.Name]++
		}
		return g, names
	}
	folded, fn := run(true)
	apart, an := run(false)

	require.Zero(t, fn["pending_responses"], "C8 rides C7")
	require.Positive(t, an["pending_responses"])
	require.Equal(t, an["responses"], fn["responses"])
	require.Less(t, fn["responses"]+fn["pending_responses"], an["responses"]+an["pending_responses"])

	fo, ao := folded.outputs(t), apart.outputs(t)
	require.Len(t, fo, len(reqs))
	require.Contains(t, fo[4].Error, "exceeds max_num_tokens")
	require.Equal(t, ao, fo)
	f0, a0 := folded.ranks[0].res, apart.ranks[0].res
	require.Equal(t, a0.LockstepWaste, f0.LockstepWaste)
	require.Equal(t, a0.TokenBalance, f0.TokenBalance)
	require.Equal(t, a0.BalanceIterations, f0.BalanceIterations)
	require.Equal(t, a0.ForwardMS, f0.ForwardMS)
	require.Equal(t, a0.VirtualEnd, f0.VirtualEnd)
	require.Positive(t, f0.BalanceIterations)

	strip := func(lines [][]byte) []map[string]any {
		var out []map[string]any
		for _, l := range lines {
			var m map[string]any
			require.NoError(t, json.Unmarshal(l, &m))
			for _, k := range []string{"host_ms", "iter_ms", "wait_ms"} {
				delete(m, k)
			}
			out = append(out, m)
		}
		return out
	}
	for i := range folded.ranks {
		fl, al := strip(folded.ranks[i].log.lines), strip(apart.ranks[i].log.lines)
		require.NotEmpty(t, fl, "rank %d", i)
		require.Equal(t, al, fl, "rank %d's iteration log", i)
		require.Contains(t, fl[len(fl)-1], "fleet_device_ms", "rank %d", i)
	}
}
