package kvpool_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/internal/cputime"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
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

// BenchmarkMatchAdmit128k measures admitting a 131 072-token prompt against
// a warm tree that holds all of it: the radix walk, claiming every block
// (holds, then locks on resume) and the one-token ResizeContext of the last
// chunk, in thread CPU time (cpu-ns/op; ns/op is wall time). keys=fresh
// is a request seen for the first time: hashing its lookup tokens into the
// chain of lookup keys is part of it (the SHA-256 event hashes of the
// blocks were computed when they were stored, by the warm-up prefill, and
// are not: a match never needs them). keys=kept is the same request admitted again,
// as a waiting request is at every pass after its first: the chain is kept
// on the request (scheduler.BlockKeyChain), so only the walk and the claim
// remain. Target (issue 24): ≤ 1 ms at 16 tokens per page.
func BenchmarkMatchAdmit128k(b *testing.B) {
	for _, p := range []int{16, 64} {
		for _, kept := range []bool{false, true} {
			name := fmt.Sprintf("P=%d/keys=fresh", p)
			if kept {
				name = fmt.Sprintf("P=%d/keys=kept", p)
			}
			b.Run(name, func(b *testing.B) {
				const promptLen = 128 * 1024
				m := newCfg(b, kvpool.Config{NumPages: 2*promptLen/p + 16, TokensPerPage: p, EnableBlockReuse: true})
				tokens := make([]int32, promptLen)
				for i := range tokens {
					tokens[i] = int32(i*7919) % 50_000
				}
				warm := preq(1, tokens, 1)
				prefill(b, m, warm)
				m.Free(warm)
				r := preq(2, tokens, 1)
				var cpu time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if !kept {
						r = preq(2, tokens, 1)
					}
					d, _ := cputime.Span(func() {
						if !m.PrepareContext(r) || r.ContextPosition != promptLen-1 || !m.ResizeContext(r, 1) {
							b.Fatalf("admission failed at position %d", r.ContextPosition)
						}
					})
					cpu += d
					b.StopTimer()
					m.ReleaseContextAdmission(r)
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkFlushIterationEvents measures one iteration's event work on a
// busy rank: 8 requests each commit 2 blocks (coalesced stored events),
// 8 cached blocks are evicted (one removed event), then the flush and the
// JSON Lines encoding of the batch.
func BenchmarkFlushIterationEvents(b *testing.B) {
	const p = 16
	m := newCfg(b, kvpool.Config{NumPages: 24, TokensPerPage: p, EnableBlockReuse: true, EventBufferMaxSize: 64})
	m.FlushIterationEvents()
	var buf []byte
	next := int32(0)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var reqs []*scheduler.Request
		for i := range 8 {
			r := preq(uint64(i), span(next, next+2*p-1), 1)
			next += 2 * p
			prefill(b, m, r)
			reqs = append(reqs, r)
		}
		for _, r := range reqs {
			m.Free(r)
		}
		buf = buf[:0]
		for _, e := range m.FlushIterationEvents() {
			buf = e.AppendJSONL(buf, 1, 0)
		}
	}
}
