package executor

import (
	"testing"
	"time"

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

// TestCancelledQueuedRequestsNeverRun: a request cancelled while it waits
// in the queue beyond the cap H (routed to no rank) leaves the queue on
// every rank and is answered "cancelled" by rank 0 at once, without a
// token; the others run as before. Before, the cancellation looked only
// at the ranks' active requests: a client that gave up on a queued request
// left it to run to its end once routed.
func TestCancelledQueuedRequestsNeverRun(t *testing.T) {
	reqs := sampleRequests(t, 12, 0.02)
	for i := range reqs {
		reqs[i].MaxNewTokens = 6
	}
	ref := (&fleet{ranks: 2, reqs: reqs}).mustRun(t)
	want := map[uint64][]int32{}
	for _, r := range ref.results[0].Responses {
		want[r.ID] = r.Output
	}
	for _, overlap := range []bool{false, true} {
		cancel := map[uint64]bool{}
		for _, r := range reqs[6:] {
			cancel[uint64(r.Index)] = true
		}
		src := &cancellingSource{TraceSource: NewTraceSource(reqs, time.Now()), after: 1, cancel: cancel,
			out: map[uint64]int{}, done: map[uint64]bool{}}
		f := (&fleet{ranks: 2, reqs: reqs, overlap: overlap, maxActive: 1, source: src}).mustRun(t)
		seen := map[uint64]bool{}
		for _, r := range f.results[0].Responses {
			require.False(t, seen[r.ID], "overlap %v: request %d answered twice", overlap, r.ID)
			seen[r.ID] = true
			if cancel[r.ID] {
				require.Equal(t, CancelledError, r.Error, "overlap %v: request %d", overlap, r.ID)
				require.Equal(t, NoRank, r.Rank, "overlap %v: request %d was routed", overlap, r.ID)
				require.Empty(t, r.Output, "overlap %v: request %d ran", overlap, r.ID)
				continue
			}
			require.Empty(t, r.Error, "overlap %v: request %d", overlap, r.ID)
			require.Equal(t, want[r.ID], r.Output, "overlap %v: request %d", overlap, r.ID)
		}
		require.Len(t, seen, len(reqs), "overlap %v: every request is answered", overlap)
		for i, kv := range f.kvs {
			require.Equal(t, kv.TotalPages(), kv.FreePages()+kv.CachedPages(), "overlap %v: rank %d left pages behind", overlap, i)
		}
	}
}
