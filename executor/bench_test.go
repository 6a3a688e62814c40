package executor

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkExecutorIteration measures the control plane of one iteration:
// in-process ranks over the fake engine (whose compute is nearly free), with
// intake, routing, scheduling, the agreement collectives, step building,
// result application and response gathers, in both loops. It reports wall
// ns per iteration and the part of it rank 0 spent blocked in collectives.
func BenchmarkExecutorIteration(b *testing.B) {
	for _, ranks := range []int{1, 4} {
		for _, overlap := range []bool{false, true} {
			b.Run(fmt.Sprintf("ranks=%d/overlap=%v", ranks, overlap), func(b *testing.B) {
				reqs := longOutputRequests(64, 64, 32)
				var iters int64
				var total time.Duration
				var collMS float64
				for i := 0; i < b.N; i++ {
					f := &fleet{ranks: ranks, reqs: reqs, pages: 1024, overlap: overlap}
					start := time.Now()
					f.run(b)
					total += time.Since(start)
					f.requireNoErrors(b)
					iters += f.results[0].Iterations
					collMS += f.results[0].CollectiveMS
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(iters), "ns/iter")
				b.ReportMetric(collMS*1e6/float64(iters), "collective-ns/iter")
				b.ReportMetric(float64(iters)/float64(b.N), "iters/run")
			})
		}
	}
}
