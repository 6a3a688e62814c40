package scheduler

import (
	"fmt"
	"testing"
)

// benchKV is a KV manager that always succeeds and keeps no state, so the
// benchmarks measure the scheduler alone.
type benchKV struct{}

func (benchKV) PrepareContext(*Request) bool                  { return true }
func (benchKV) ResizeContext(*Request, int) bool              { return true }
func (benchKV) PrepareBlocksIfSchedulable(*Request, int) bool { return true }
func (benchKV) ReleaseContextAdmission(*Request)              {}
func (benchKV) TryAllocateGeneration(*Request) bool           { return true }
func (benchKV) RevertAllocateGeneration(*Request)             {}
func (benchKV) Suspend(*Request)                              {}
func (benchKV) Free(*Request)                                 {}
func (benchKV) IsActive(uint64) bool                          { return true }
func (benchKV) HasCache(uint64) bool                          { return true }
func (benchKV) HasHostTier() bool                             { return false }
func (benchKV) HoldsDevicePages(uint64) bool                  { return true }
func (benchKV) BlockReuseEnabled() bool                       { return false }
func (benchKV) ReusePolicy() ReusePolicy                      { return PerRequest }
func (benchKV) ProbeFirstNewBlockKey(*Request) (BlockKey, bool) {
	return BlockKey{}, false
}

// benchList builds n active requests of mixed states: one in eight is a
// context request (first chunks and continuations at depths spread from 0 to
// ~1.2 M tokens, a third of them long enough to be demoted), the rest decode.
func benchList(n int) []*Request {
	list := make([]*Request, n)
	for i := range list {
		id := uint64(i)
		switch {
		case i%8 == 3:
			p := (i * 7919) % 1200000
			r := newReq(id, ContextInProgress, p+20000+(i*997)%60000, p)
			if i%3 == 0 {
				r.UncachedEstimate = int64(r.Remaining())
			}
			list[i] = r
		case i%8 == 7:
			r := newReq(id, ContextInit, 500+i%9000, 0)
			r.UncachedEstimate = int64(r.PromptLen) * int64(1+i%5) * 8
			list[i] = r
		default:
			list[i] = gen(id)
		}
	}
	return list
}

// benchConfig: batch = n, M = n + 16 384 so that every generation request and
// a few context chunks fit; optional equal-cost cap (configuration A) and
// demotion (U = 32 768, K = 4).
func benchConfig(n int, costCap, demote bool) Config {
	c := baseConfig()
	c.MaxBatchSize, c.MaxNumTokens = n, n+16384
	c.ChunkedContext, c.ChunkUnitSize = true, 64
	if costCap {
		c.EqualCost = EqualCost{KVOffset: 35000, KVDepthThreshold: 250000}
	}
	if demote {
		c.Demotion = Demotion{UncachedTokens: 32768, MaxIters: 4}
	}
	return c
}

// BenchmarkSchedule measures one scheduling pass in steady state (the same
// active list every pass; buffers warmed by the first pass).
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{256, 2048, 16384} {
		for _, mode := range []struct {
			name           string
			costCap, demot bool
		}{{"plain", false, false}, {"cost+demotion", true, true}} {
			b.Run(fmt.Sprintf("n=%d/%s", n, mode.name), func(b *testing.B) {
				list := benchList(n)
				s, err := New(benchConfig(n, mode.costCap, mode.demot), benchKV{})
				if err != nil {
					b.Fatal(err)
				}
				exec := []uint64{1, 2, 5, 9}
				for i := 0; i < 8; i++ { // warm the buffers and the demotion map
					if _, err := s.Schedule(list, exec); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					out, err := s.Schedule(list, exec)
					if err != nil || out.NumFitting == 0 {
						b.Fatal("nothing scheduled", err)
					}
				}
			})
		}
	}
}

// TestScheduleAllocatesNothing pins the steady-state allocation target of
// the benchmarks as a test.
func TestScheduleAllocatesNothing(t *testing.T) {
	for _, n := range []int{256, 2048} {
		list := benchList(n)
		s := mustNew(t, benchConfig(n, true, true), benchKV{})
		for i := 0; i < 8; i++ {
			schedule(t, s, list, 1, 2)
		}
		out := schedule(t, s, list, 1, 2)
		if len(out.Context) == 0 || s.DemotionEntries() == 0 || out.CostUsed == 0 || len(out.Generation) == 0 {
			t.Fatalf("n=%d: the benchmark list must exercise contexts, demotion and the cost cap: ctx %d demotion entries %d cost %d gen %d", n, len(out.Context), s.DemotionEntries(), out.CostUsed, len(out.Generation))
		}
		allocs := testing.AllocsPerRun(50, func() { _, _ = s.Schedule(list, []uint64{1, 2}) })
		if allocs != 0 {
			t.Fatalf("n=%d: %v allocations per pass, want 0", n, allocs)
		}
	}
}

// FirstChunkBlocked never promises a failure: every first chunk is tried.
func (benchKV) FirstChunkBlocked(*Request, func(*Request, int) int) bool { return false }

// NoFirstChunkFits never promises a failure.
func (benchKV) NoFirstChunkFits() bool { return false }
