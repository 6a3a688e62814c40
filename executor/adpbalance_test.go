package executor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// TestADPBalanceDecision walks TensorRT-LLM's ADP Balance rule through its
// cases on two ranks ([contexts, generations] per rank), timeout_iters 3,
// batching_wait_iters 2, max_batch_size 4: the decision and both counters
// after each iteration.
func TestADPBalanceDecision(t *testing.T) {
	e := &Executor{cfg: Config{Scheduler: scheduler.Config{MaxBatchSize: 4},
		ADPBalance: ADPBalance{Enable: true, TimeoutIters: 3, BatchingWaitIters: 2}}}
	for i, c := range []struct {
		counts    [][2]int
		hold      bool
		wait, bat int
		why       string
	}{
		{[][2]int{{1, 2}, {0, 3}}, true, 1, 0, "rank 1 has no context: wait"},
		{[][2]int{{1, 2}, {0, 3}}, true, 2, 0, "still waiting"},
		{[][2]int{{1, 2}, {0, 3}}, false, 0, 0, "timeout_iters reached: run"},
		{[][2]int{{1, 2}, {0, 1}}, true, 1, 0, "waiting again (rank 1's padding dummy counts as a generation)"},
		{[][2]int{{2, 0}, {0, 3}}, false, 0, 0, "a rank without generations: never wait on an idle rank"},
		{[][2]int{{1, 2}, {1, 2}}, true, 0, 1, "every rank has a context and a decode: equilibrate"},
		{[][2]int{{2, 2}, {1, 2}}, true, 0, 2, "equilibrate"},
		{[][2]int{{3, 2}, {2, 2}}, false, 0, 0, "batching_wait_iters reached: run"},
		{[][2]int{{1, 0}, {1, 0}}, false, 0, 0, "contexts everywhere, no decode: run at once"},
		{[][2]int{{1, 4}, {1, 2}}, true, 1, 0, "rank 0 has no free slot (4 decodes = max_batch_size): wait"},
		{[][2]int{{0, 1}, {0, 1}}, true, 2, 0, "no context anywhere: the wait counter still runs (nothing to hold)"},
	} {
		got := e.holdContexts(c.counts)
		require.Equal(t, c.hold, got, "iteration %d: %s", i, c.why)
		require.Equal(t, c.wait, e.adpWait, "iteration %d wait counter: %s", i, c.why)
		require.Equal(t, c.bat, e.adpBatch, "iteration %d batching counter: %s", i, c.why)
	}
}

// TestADPBalanceRun: with ADP Balance on, three in-process ranks in both
// loops answer every request with the tokens they give with it off (the
// fake engine's outputs depend on the tokens only) while the contexts were
// held in some iterations; negative iteration counts are refused.
func TestADPBalanceRun(t *testing.T) {
	reqs := sampleRequests(t, 64, 0.2)
	for _, overlap := range []bool{false, true} {
		base := (&fleet{ranks: 3, reqs: reqs, overlap: overlap}).mustRun(t)
		require.Zero(t, base.results[0].ADPBalanceHeld)
		f := (&fleet{ranks: 3, reqs: reqs, overlap: overlap,
			balance: ADPBalance{Enable: true, TimeoutIters: 50, BatchingWaitIters: 10}}).mustRun(t)
		require.Equal(t, base.digest(t), f.digest(t), "overlap %v: the same answers with balance on", overlap)
		held := f.results[0].ADPBalanceHeld
		require.Positive(t, held, "overlap %v", overlap)
		for _, r := range f.results {
			require.Equal(t, held, r.ADPBalanceHeld, "every rank made the same decisions")
		}
		require.Greater(t, f.results[0].Iterations, base.results[0].Iterations, "holding costs iterations")
	}

	e, _, _ := unitExec(t, 0, 1, 16, nil)
	cfg := Config{Ranks: 1, ADPBalance: ADPBalance{Enable: true, TimeoutIters: -1}}
	require.ErrorContains(t, cfg.validate(e.d), "timeout_iters -1")
}
