package kvpool_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Pool and allocation scenarios (kvcache.md §11.1, KP) and the host-tier
// sequence scenarios (§11.2, KS-05…07). KP-01 is TestLowestIndexFirst,
// KP-08 TestMaxSeqLen.

// TestCachedPageNotEnough is KP-02 and KP-03: an infeasible allocation
// changes nothing, drops nothing and emits nothing.
func TestCachedPageNotEnough(t *testing.T) {
	for _, tt := range []struct {
		name           string
		cached, inUse  int
		allocateTokens int
	}{{"KP-02", 1, 3, 8}, {"KP-03", 2, 2, 12}} {
		m := newCfg(t, reuseCfg(4))
		for i := range tt.cached {
			runAndFree(t, m, preq(uint64(100+i), span(int32(10*i), int32(10*i+3)), 1))
		}
		prefill(t, m, preq(1, span(200, int32(200+4*tt.inUse-1)), 1))
		m.FlushIterationEvents()
		r := preq(2, span(300, int32(300+tt.allocateTokens-1)), 1)
		m.PrepareContext(r)
		if m.ResizeContext(r, tt.allocateTokens) {
			t.Fatalf("%s: infeasible allocation succeeded", tt.name)
		}
		if m.CachedPages() != tt.cached || len(m.FlushIterationEvents()) != 0 {
			t.Fatalf("%s: cached %d (want %d) or events emitted", tt.name, m.CachedPages(), tt.cached)
		}
		mustCheck(t, m)
	}
}

// TestEvictLeastRecentlyUsed is KP-04.
func TestEvictLeastRecentlyUsed(t *testing.T) {
	m := newCfg(t, reuseCfg(4))
	a, b := preq(100, span(1, 4), 1), preq(101, span(11, 14), 1)
	prefill(t, m, a)
	prefill(t, m, b)
	pageA, pageB := m.BlockTable(100)[0], m.BlockTable(101)[0]
	m.Free(a) // A becomes cached first: older use
	m.Free(b)
	prefill(t, m, preq(1, span(200, 207), 1)) // the 2 other pages
	m.FlushIterationEvents()
	r := preq(2, span(300, 303), 1)
	prefill(t, m, r)
	if got := m.BlockTable(2); !slices.Equal(got, []int32{pageA}) {
		t.Fatalf("allocated %v, want A's page %d", got, pageA)
	}
	removed := eventsOf(m, kvpool.EventRemoved)
	keyA := kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4))
	if len(removed) != 1 || !slices.Equal(removed[0].Hashes, []scheduler.BlockKey{keyA}) {
		t.Fatalf("removed %+v, want [A]", removed)
	}
	if m.CachedPages() != 1 || m.ProbeReuse(preq(3, span(11, 15), 1)) != 4 {
		t.Fatalf("B (page %d) not untouched", pageB)
	}
	mustCheck(t, m)
}

// heldPool builds KP-05's pool: 4 GPU pages all held by S1 (blocks 0, 1;
// suspended first) and S2, both with committed blocks.
func heldPool(t *testing.T, hostPages int) (*kvpool.Manager, []int32) {
	cfg := reuseCfg(4)
	cfg.HostPages = hostPages
	m := newCfg(t, cfg)
	s1, s2 := preq(1, span(1, 8), 1), preq(2, span(11, 18), 1)
	prefill(t, m, s1)
	prefill(t, m, s2)
	s1Pages := slices.Clone(m.BlockTable(1))
	m.Suspend(s1)
	m.Suspend(s2)
	m.FlushIterationEvents()
	return m, s1Pages
}

// TestMigrateHeldPages is KP-05 (and the first half of EV-15).
func TestMigrateHeldPages(t *testing.T) {
	m, s1Pages := heldPool(t, 2)
	r := preq(3, span(100, 107), 1)
	prefill(t, m, r)
	want := []kvpool.PageCopy{
		{SrcTier: kvpool.TierGPU, SrcPage: s1Pages[1], DstTier: kvpool.TierHost, DstPage: 0},
		{SrcTier: kvpool.TierGPU, SrcPage: s1Pages[0], DstTier: kvpool.TierHost, DstPage: 1},
	}
	if got := m.TakeCopies(); !slices.Equal(got, want) {
		t.Fatalf("copies %+v, want %+v", got, want)
	}
	updated := eventsOf(m, kvpool.EventUpdated)
	if len(updated) != 2 || updated[0].FromLevel != 0 || updated[0].ToLevel != 1 {
		t.Fatalf("updated events %+v, want two 0→1", updated)
	}
	if info(t, m, 1).HostPages != 2 || info(t, m, 2).HostPages != 0 {
		t.Fatal("S1 not fully migrated or S2 touched")
	}
	mustCheck(t, m)
}

// TestNoHostTierNoMigration is KP-06.
func TestNoHostTierNoMigration(t *testing.T) {
	m, _ := heldPool(t, 0)
	r := preq(3, span(100, 107), 1)
	m.PrepareContext(r)
	if m.ResizeContext(r, 8) || len(m.TakeCopies()) != 0 || info(t, m, 1).HostPages != 0 {
		t.Fatal("allocation without a host tier moved pages")
	}
	mustCheck(t, m)
}

// TestPageTableRows is KP-07 and KP-09.
func TestPageTableRows(t *testing.T) {
	for _, tt := range []struct {
		batch    int
		overlap  bool
		reserved int
		want     int
	}{{2, true, 1, 5}, {8, true, 1, 17}, {2, false, 1, 3}, {2, true, 5, 9}} {
		if got := kvpool.PageTableRows(tt.batch, tt.overlap, tt.reserved); got != tt.want {
			t.Errorf("PageTableRows(%d, %v, %d) = %d, want %d", tt.batch, tt.overlap, tt.reserved, got, tt.want)
		}
	}
	m := newCfg(t, kvpool.Config{NumPages: 16, TokensPerPage: 4, PageTableRows: 3, ReservedIndexSlots: 1})
	a, b, c := req(1, 4, 1), req(2, 4, 1), req(3, 4, 1)
	if !m.PrepareContext(a) || !m.PrepareContext(b) {
		t.Fatal("admissible rows refused")
	}
	if m.PrepareContext(c) || m.HasCache(3) {
		t.Fatal("KP-09: third ordinary cache got the reserved row")
	}
	if !m.AddDummy(req(1<<62, 1, 1), 1) || m.Row(1<<62) != 2 {
		t.Fatal("dummy did not get the reserved row")
	}
	m.Free(a)
	if !m.PrepareContext(c) || m.Row(3) != 0 {
		t.Fatal("retry after a free did not take row 0")
	}
	mustCheck(t, m)
}

// suspendedWithHostPage builds a cache (request 1, two committed blocks)
// whose block 1 was migrated to the host, and leaves utilisation at
// usedPages/4 with the rest free.
func suspendedWithHostPage(t *testing.T, usedPages int) *kvpool.Manager {
	cfg := reuseCfg(4)
	cfg.HostPages = 2
	m := newCfg(t, cfg)
	s := preq(1, cat(span(1, 4), []int32{5}), 1)
	prefill(t, m, s)
	m.Suspend(s)
	x := preq(2, span(100, 111), 1) // 3 pages: 2 free + 1 migrated
	prefill(t, m, x)
	m.Free(x)
	if usedPages > 1 {
		prefill(t, m, preq(3, span(200, int32(200+4*(usedPages-1)-1)), 1))
	}
	m.TakeCopies()
	m.FlushIterationEvents()
	return m
}

// TestResumeGate is KS-05, KS-06 and KS-07 (and the second half of EV-15).
func TestResumeGate(t *testing.T) {
	// KS-05: all pages on the GPU: no gate even at utilisation 1.
	m := newCfg(t, kvpool.Config{NumPages: 4, TokensPerPage: 4})
	s := req(1, 4, 1)
	m.PrepareContext(s)
	m.ResizeContext(s, 4)
	m.Suspend(s)
	other := req(2, 12, 1)
	m.PrepareContext(other)
	m.ResizeContext(other, 12)
	if m.Utilization() != 1 {
		t.Fatalf("setup: utilisation %g", m.Utilization())
	}
	if !m.PrepareContext(s) || !m.IsActive(1) {
		t.Fatal("KS-05: resume refused without host pages")
	}

	// KS-06: a page on the host and utilisation 0.98 > 0.97 → refused.
	cfg := reuseCfg(100)
	cfg.HostPages = 2
	m = newCfg(t, cfg)
	sr := preq(1, span(1, 8), 1)
	prefill(t, m, sr)
	m.Suspend(sr)
	prefill(t, m, preq(2, span(1000, 1000+96*4-1), 1)) // 96 pages
	y := preq(3, span(5000, 5011), 1)                  // 3 pages: 2 free + 1 migrated
	prefill(t, m, y)
	m.Free(y)
	prefill(t, m, preq(4, span(6000, 6003), 1))
	if u := m.Utilization(); u < 0.979 || u > 0.981 || info(t, m, 1).HostPages != 1 {
		t.Fatalf("setup: utilisation %g, host pages %d", u, info(t, m, 1).HostPages)
	}
	if m.PrepareContext(sr) || info(t, m, 1).Status != kvpool.SeqSuspended {
		t.Fatal("KS-06: resume at utilisation 0.98 with a host page was not refused")
	}
	mustCheck(t, m)

	// KS-07: utilisation 0.5 → one host→GPU copy, updated 1→0, row rewritten.
	m = suspendedWithHostPage(t, 2)
	if m.Utilization() != 0.5 {
		t.Fatalf("setup: utilisation %g", m.Utilization())
	}
	r := preq(1, cat(span(1, 4), []int32{5}), 1)
	if !m.PrepareContext(r) {
		t.Fatal("KS-07: resume refused")
	}
	copies := m.TakeCopies()
	if len(copies) != 1 || copies[0].SrcTier != kvpool.TierHost || copies[0].DstTier != kvpool.TierGPU {
		t.Fatalf("copies %+v, want one host→GPU", copies)
	}
	if got := m.BlockTable(1)[1]; got != copies[0].DstPage {
		t.Fatalf("row holds page %d, copy went to %d", got, copies[0].DstPage)
	}
	updated := eventsOf(m, kvpool.EventUpdated)
	if len(updated) != 1 || updated[0].FromLevel != 1 || updated[0].ToLevel != 0 {
		t.Fatalf("updated %+v, want one 1→0", updated)
	}
	mustCheck(t, m)
}

// TestCapacityBelowHistoryPanics is the shrink half of KS-04 (a history
// decrease through UpdateAfter* is ignored: those calls are idempotent).
func TestCapacityBelowHistoryPanics(t *testing.T) {
	m := newCfg(t, kvpool.Config{NumPages: 4, TokensPerPage: 4})
	r := req(1, 4, 2)
	m.PrepareContext(r)
	m.ResizeContext(r, 4)
	m.TryAllocateGeneration(r)
	r.ContextPosition = 5
	m.UpdateAfterContext(r) // history 5 covers the grown token
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "capacity-above-history") {
			t.Fatalf("panic %v, want capacity-above-history", p)
		}
	}()
	m.RevertAllocateGeneration(r)
}

// TestCopyRuns checks the grouping that keeps copy order.
func TestCopyRuns(t *testing.T) {
	g, h := kvpool.TierGPU, kvpool.TierHost
	runs := kvpool.CopyRuns([]kvpool.PageCopy{{g, 1, h, 0}, {g, 2, h, 1}, {h, 0, g, 3}, {g, 4, h, 2}})
	if len(runs) != 3 || !slices.Equal(runs[0].Src, []int32{1, 2}) || runs[1].SrcTier != h || !slices.Equal(runs[2].Dst, []int32{2}) {
		t.Fatalf("runs %+v", runs)
	}
}
