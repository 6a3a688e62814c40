package executor

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// A request with StopAtEOS ends at the first stop token it samples (kept as
// its last output token), or at its length limit without one; the outputs
// are identical on 1 and 4 ranks and in both loops, under KV pressure
// (recompute preemption) as with room to spare.
func TestStopTokensEndGeneration(t *testing.T) {
	stops := make([]int32, 0, 24)
	for tok := int32(0); tok < 512; tok += 21 { // ~5% of the tiny vocabulary
		stops = append(stops, tok)
	}
	var want string
	for _, ranks := range []int{1, 4} {
		for _, overlap := range []bool{false, true} {
			for _, pages := range []int{256, 24} {
				t.Run(fmt.Sprintf("ranks=%d/overlap=%v/pages=%d", ranks, overlap, pages), func(t *testing.T) {
					reqs := sampleRequests(t, 40, 0.02)
					for i := range reqs {
						reqs[i].MaxNewTokens = 48
						reqs[i].StopAtEOS = i%4 != 3 // every fourth ignores stop tokens
					}
					f := &fleet{ranks: ranks, overlap: overlap, pages: pages, reqs: reqs, stopTokens: stops}
					f.sched = defaultSched()
					f.run(t)
					f.requireNoErrors(t)
					stopped := 0
					for _, r := range f.results[0].Responses {
						req := reqs[r.ID]
						first := slices.IndexFunc(r.Output, func(x int32) bool { return slices.Contains(stops, x) })
						switch {
						case !req.StopAtEOS:
							require.False(t, r.Stopped, "request %d ignores stop tokens", r.ID)
							require.Len(t, r.Output, req.MaxNewTokens)
						case r.Stopped:
							stopped++
							require.Equal(t, len(r.Output)-1, first, "request %d: output must end at its first stop token", r.ID)
						default:
							require.Equal(t, -1, first, "request %d sampled a stop token without stopping", r.ID)
							require.Len(t, r.Output, req.MaxNewTokens)
						}
					}
					require.Greater(t, stopped, 10, "the stop tokens must end most requests early")
					preempted := 0
					for _, r := range f.results[0].Responses {
						preempted += r.Recomputed + r.Suspended
					}
					if pages < 100 {
						require.Positive(t, preempted, "the small pool must preempt")
					}
					d := f.digest(t)
					if want == "" {
						want = d
					}
					require.Equal(t, want, d, "outputs differ from the first configuration")
					for _, kv := range f.kvs {
						require.Equal(t, pages, kv.FreePages(), "pages left behind")
					}
				})
			}
		}
	}
}
