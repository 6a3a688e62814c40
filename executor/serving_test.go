package executor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRankLoadCountsCachedPagesFree: with prefix reuse, a rank's used pages
// are those its sequences hold; the cached blocks left behind by finished
// requests are evictable and count as free (vLLM's kv_cache_usage_perc).
// Before, an idle server reported its pool nearly full once the cache
// had filled it.
func TestRankLoadCountsCachedPagesFree(t *testing.T) {
	reqs := sampleRequests(t, 24, 0.02)
	var last FleetStats
	iters := 0
	f := &fleet{ranks: 2, events: 64, reqs: reqs, onIteration: func(st FleetStats) {
		iters++
		last = st
		for r, l := range st.Ranks {
			require.GreaterOrEqual(t, l.UsedPages, int64(0), "iteration %d rank %d", st.Iter, r)
			require.LessOrEqual(t, l.UsedPages, l.Pages, "iteration %d rank %d", st.Iter, r)
		}
	}}
	f.mustRun(t)
	require.Positive(t, iters)
	cached := 0
	for _, kv := range f.kvs {
		cached += kv.CachedPages()
	}
	require.Positive(t, cached, "the finished requests leave cached blocks")
	require.Len(t, last.Ranks, 2)
	for r, l := range last.Ranks {
		require.Zero(t, l.Running, "rank %d", r)
		require.Zero(t, l.UsedPages, "rank %d: no sequence holds a page after the last request", r)
	}
}
