package executor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// TestEveryRankSendsItsLoad: every rank of a server sends its load
// (before, only rank 0, the one with the hook, computed it: the others
// reported zeros), and with prefix reuse a rank's used pages are those its
// sequences hold; the cached blocks left behind by finished requests are
// evictable and count as free (vLLM's kv_cache_usage_perc). Before, an
// idle server reported its pool nearly full once the cache had filled it.
func TestEveryRankSendsItsLoad(t *testing.T) {
	reqs := sampleRequests(t, 24, 0.02)
	for i := range reqs {
		reqs[i].MaxNewTokens = 16
	}
	var stats []FleetStats
	f := &fleet{ranks: 2, events: 64, reqs: reqs, onIteration: func(st FleetStats) {
		// Rank 0's loop goroutine: kept and checked after the run.
		stats = append(stats, st)
	}}
	f.mustRun(t)
	require.NotEmpty(t, stats)
	var maxRunning, maxUsed [2]int64
	for _, st := range stats {
		require.Len(t, st.Ranks, 2)
		for r, l := range st.Ranks {
			require.Positive(t, l.Pages, "iteration %d rank %d", st.Iter, r)
			require.GreaterOrEqual(t, l.UsedPages, int64(0), "iteration %d rank %d", st.Iter, r)
			require.LessOrEqual(t, l.UsedPages, l.Pages, "iteration %d rank %d", st.Iter, r)
			maxRunning[r], maxUsed[r] = max(maxRunning[r], l.Running), max(maxUsed[r], l.UsedPages)
		}
	}
	last := stats[len(stats)-1]
	for r := range 2 {
		require.Positive(t, maxRunning[r], "rank %d reported running requests (every rank sends its load)", r)
		require.Positive(t, maxUsed[r], "rank %d reported used pages", r)
	}
	cached := 0
	for _, kv := range f.kvs {
		cached += kv.CachedPages()
	}
	require.Positive(t, cached, "the finished requests leave cached blocks")
	for r, l := range last.Ranks {
		require.Zero(t, l.Running, "rank %d", r)
		require.Zero(t, l.UsedPages, "rank %d: no sequence holds a page after the last request", r)
	}
}

// TestFleetStatsCountTheQueue: requests beyond the ranks' cap H wait in the
// queue, routed to no rank; FleetStats.Queued counts them (no rank's load
// does), so a server's metrics see the whole backlog.
func TestFleetStatsCountTheQueue(t *testing.T) {
	reqs := sampleRequests(t, 12, 0.02)
	for i := range reqs {
		reqs[i].MaxNewTokens = 4
	}
	var stats []FleetStats
	f := &fleet{ranks: 2, maxActive: 2, reqs: reqs, onIteration: func(st FleetStats) { stats = append(stats, st) }}
	f.mustRun(t)
	require.NotEmpty(t, stats)
	first, last := stats[0], stats[len(stats)-1]
	var held int64
	for _, l := range first.Ranks {
		held += l.Running + l.Waiting
	}
	require.Equal(t, 12, first.Queued+int(held), "every request is either on a rank or queued: %+v", first)
	require.Equal(t, 8, first.Queued, "two ranks of cap 2 hold 4 of the 12")
	for i := 1; i < len(stats); i++ {
		require.LessOrEqual(t, stats[i].Queued, stats[i-1].Queued, "iteration %d: the queue only drains", stats[i].Iter)
	}
	require.Zero(t, last.Queued)
}

// TestSuspendedRequestsWait: a request suspended to the host tier holds no
// batch slot until it resumes; a rank's load counts it waiting, as vLLM
// counts a preempted request (num_requests_waiting), not running. Before,
// every request past its first chunk counted running.
func TestSuspendedRequestsWait(t *testing.T) {
	var items []Arrival
	for i := range 12 {
		items = append(items, arrival(uint64(i), 20+3*i, 24))
	}
	sc := defaultSched()
	sc.MaxBatchSize = 8
	suspendedSeen := 0
	var failures []string
	g := (&rig{n: 1, pages: 24, sc: sc, src: allAtOnce(items...),
		kvcfg: func(_ int, c *kvpool.Config) { c.HostPages = 96 },
		after: func(rr *rigRank) {
			l := rr.ex.load()
			var running, suspended, first int64
			for _, r := range rr.ex.active {
				switch {
				case r.IsDummy || r.State == scheduler.Complete:
				case r.State == scheduler.ContextInit:
					first++
				case rr.pool.IsActive(r.ID):
					running++
				default:
					suspended++
				}
			}
			if suspended > 0 {
				suspendedSeen++
			}
			if l.Running != running || l.Waiting != first+suspended {
				failures = append(failures, fmt.Sprintf("iteration %d: load running %d waiting %d; active caches %d, first chunks %d, suspended %d",
					rr.ex.iter, l.Running, l.Waiting, running, first, suspended))
			}
		}}).build(t)
	g.drive(0)
	g.requireNoErrors(t)
	require.Len(t, g.outputs(t), len(items))
	require.Positive(t, suspendedSeen, "the pool is small enough that some request is suspended")
	require.Empty(t, failures)
}
