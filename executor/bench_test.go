package executor

import (
	"testing"
	"time"
)

// BenchmarkExecutorIteration measures the control plane of one iteration:
// 4 in-process ranks over the fake engine (so the engine costs nearly
// nothing), with intake, routing, scheduling, the agreement collectives,
// step building, result application and response gathers. It reports
// ns per iteration (wall time of the run / iterations) and the share of it
// spent waiting in collectives is in the iteration log (wait_ms).
func BenchmarkExecutorIteration(b *testing.B) {
	for _, ranks := range []int{1, 4} {
		b.Run(map[int]string{1: "ranks=1", 4: "ranks=4"}[ranks], func(b *testing.B) {
			reqs := longOutputRequests(64, 64, 32)
			var iters int64
			var total time.Duration
			for i := 0; i < b.N; i++ {
				f := &fleet{ranks: ranks, reqs: reqs, pages: 1024}
				start := time.Now()
				f.run(b)
				total += time.Since(start)
				f.requireNoErrors(b)
				iters += f.results[0].Iterations
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(iters), "ns/iter")
			b.ReportMetric(float64(iters)/float64(b.N), "iters/run")
		})
	}
}
