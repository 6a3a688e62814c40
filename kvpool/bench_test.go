package kvpool_test

import (
	"testing"
)

// BenchmarkAllocFree measures a context allocation of 64 pages followed by
// its release, and reports the cost per page. Steady state must not
// allocate (allocs/op = 0).
func BenchmarkAllocFree(b *testing.B) {
	const pages, p, perSeq = 4096, 16, 64
	m := newManager(b, pages, p)
	// Fragment the free list so the heap does real work.
	for i := uint64(0); i < 32; i++ {
		r := req(1000+i, p*perSeq, 0)
		m.PrepareContext(r)
		m.ResizeContext(r, r.PromptLen)
	}
	for i := uint64(0); i < 32; i += 2 {
		m.Free(req(1000+i, 0, 0))
	}
	r := req(1, p*perSeq, 0)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		m.PrepareContext(r)
		if !m.ResizeContext(r, p*perSeq) {
			b.Fatal("allocation failed")
		}
		m.Free(r)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perSeq), "ns/page")
}
