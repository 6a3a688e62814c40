package report

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/workload"
)

// A run whose computing threads (ranks × CPU engine threads) outnumber the
// cores says so beside the lockstep waste, in the text and the JSON report;
// one that fits says nothing (issues 23, 31).
func TestReportNamesCPUContention(t *testing.T) {
	res := &executor.Result{LockstepWaste: 0.652}
	for _, c := range []struct {
		ranks, threads, cores int
		text, json            string // "": no contention
	}{
		{4, 0, 2, "(4 ranks shared 2 cores here: the waste measures ranks waiting for a core, not scheduling)",
			`"cpu_contention":{"ranks":4,"threads_per_rank":1,"cores":2}`},
		{2, 1, 2, "", ""},
		{4, 0, 0, "", ""},
		{1, 2, 2, "", ""},
		{2, 2, 2, "(2 ranks × 2 threads shared 2 cores here: the waste measures threads waiting for a core, not scheduling)",
			`"cpu_contention":{"ranks":2,"threads_per_rank":2,"cores":2}`},
	} {
		rep := Build(RunInfo{Engine: "cpu", Ranks: 4, RanksHere: c.ranks, Cores: c.cores, ThreadsPerRank: c.threads}, nil, res)
		var text bytes.Buffer
		require.NoError(t, rep.WriteText(&text))
		b, err := json.Marshal(rep)
		require.NoError(t, err)
		if c.text != "" {
			require.Contains(t, text.String(), c.text)
			require.Contains(t, string(b), c.json)
		} else {
			require.NotContains(t, text.String(), "cores here")
			require.NotContains(t, string(b), "cpu_contention")
		}
	}
}

// The balance block (issue 25, item 3): the token and time balance ratios
// and the speed-of-light throughput forward / sol_forward × the output
// rate, for attention DP with two ranks or more; absent with one rank.
func TestReportBalance(t *testing.T) {
	res := &executor.Result{LockstepWaste: 0.2, TokenBalance: 0.6, BalanceIterations: 10, ForwardMS: 2000, ADPBalanceHeld: 3,
		SOLForwardMS: 1000, Responses: []executor.Response{{ID: 0, Output: make([]int32, 500), FinishUnixNS: 2e9}}}
	reqs := []workload.Request{{Index: 0, Prompt: []int32{1, 2}, MaxNewTokens: 500}}
	rep := Build(RunInfo{Engine: "twin", Ranks: 4, Wall: 2 * time.Second}, reqs, res)
	require.NotNil(t, rep.Balance)
	require.Equal(t, Balance{TokenRatio: 0.6, TimeRatio: 0.8, Iterations: 10, ForwardS: 2, SOLForwardS: 1,
		SOLOutputTokPS: 2 * rep.OutputTokPerS, ADPBalanceHeld: 3}, *rep.Balance)
	require.Positive(t, rep.OutputTokPerS)
	var text bytes.Buffer
	require.NoError(t, rep.WriteText(&text))
	require.Contains(t, text.String(), "balance      tokens 60.0%, time 80.0%")
	require.Contains(t, text.String(), "ADP Balance held the contexts in 3 iterations")
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(b), `"balance":{"token_ratio":0.6,"time_ratio":0.8,"iterations":10,"forward_s":2,"sol_forward_s":1,`)

	one := Build(RunInfo{Engine: "twin", Ranks: 1}, reqs, res)
	require.Nil(t, one.Balance)
	text.Reset()
	require.NoError(t, one.WriteText(&text))
	require.NotContains(t, text.String(), "balance ")
}
