package executor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// activeCounter records the most requests a pass was given, retiring ones
// (GENERATION_TO_COMPLETE, whose results the overlap loop has yet to
// apply) left out as the cap leaves them out.
type activeCounter struct {
	Planner
	most int
}

func (c *activeCounter) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	n := 0
	for _, r := range active {
		if r.State != scheduler.GenerationToComplete {
			n++
		}
	}
	c.most = max(c.most, n)
	return c.Planner.Schedule(active, executing)
}

// TestAdmissionCapWithoutAttentionDP (issue 24 item 5): without attention
// DP a rank admits at most H requests (Config.MaxActivePerRank); the rest
// wait in the queue in arrival order, and every request is still served
// with the tokens of an uncapped run, in both loops.
func TestAdmissionCapWithoutAttentionDP(t *testing.T) {
	reqs := sampleRequests(t, 24, 0.05)
	ref := (&fleet{ranks: 1, reqs: reqs}).mustRun(t)
	for _, overlap := range []bool{false, true} {
		var counter *activeCounter
		f := &fleet{ranks: 1, reqs: reqs, overlap: overlap, maxActive: 4, wrap: func(_ int, p Planner) Planner {
			counter = &activeCounter{Planner: p}
			return counter
		}}
		f.mustRun(t)
		require.Equal(t, ref.digest(t), f.digest(t), "overlap %v", overlap)
		require.Equal(t, 4, counter.most, "overlap %v: the most requests one pass saw", overlap)
	}
}

// TestQueuedRequestsRunWhenEveryRankGoesIdle: under attention DP with the
// cap H, requests of one length finish on every rank in the same iteration
// while more wait in the queue and the source has run dry. The next
// iteration routes them, but the rank states it gathered (before routing)
// show every rank idle: the loop took that for the end and exited with them
// admitted and never run (`worker run --overlap off --max-active-per-rank 2`
// on 12 equal requests: "12 total, 8 completed, 0 rejected").
func TestQueuedRequestsRunWhenEveryRankGoesIdle(t *testing.T) {
	reqs := sampleRequests(t, 12, 0.02)
	for i := range reqs {
		reqs[i].MaxNewTokens = 4
	}
	ref := (&fleet{ranks: 2, reqs: reqs}).mustRun(t)
	for _, overlap := range []bool{false, true} {
		f := (&fleet{ranks: 2, reqs: reqs, overlap: overlap, maxActive: 2}).mustRun(t)
		require.Len(t, f.results[0].Responses, len(reqs), "overlap %v: every request is answered", overlap)
		require.Equal(t, ref.digest(t), f.digest(t), "overlap %v", overlap)
	}
}
