package kvpool_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// newManager builds a manager or fails the test.
func newManager(t testing.TB, pages, p int) *kvpool.Manager {
	t.Helper()
	m, err := kvpool.New(kvpool.Config{NumPages: pages, TokensPerPage: p})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// req is a request with a prompt of promptLen tokens.
func req(id uint64, promptLen, maxNew int) *scheduler.Request {
	return &scheduler.Request{ID: id, State: scheduler.ContextInit, PromptLen: promptLen,
		MaxNewTokens: maxNew, BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
}

// check fails the test on a broken invariant.
func check(t *testing.T, m *kvpool.Manager) {
	t.Helper()
	if err := m.CheckInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		cfg  kvpool.Config
		want string // substring of the error; "" = success
	}{
		{kvpool.Config{NumPages: 8, TokensPerPage: 4}, ""},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, MaxSeqLen: 100}, ""},
		{kvpool.Config{NumPages: 0, TokensPerPage: 4}, "NumPages"},
		{kvpool.Config{NumPages: -1, TokensPerPage: 4}, "NumPages"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 0}, "TokensPerPage"},
		{kvpool.Config{NumPages: 8, TokensPerPage: -4}, "TokensPerPage"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, HostPages: 2}, ""},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, CP: 2, EnableBlockReuse: true}, "EnableBlockReuse"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, CP: 2, HostPages: 2}, "host cache tier"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, CP: 2, AttentionDP: true}, "AttentionDP"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, CP: 2, CPRank: 2}, "CPRank"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, PageTableRows: 2, ReservedIndexSlots: 2}, "ReservedIndexSlots"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, EventBufferMaxSize: -1}, "EventBufferMaxSize"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, HostPages: -2}, "HostPages"},
		{kvpool.Config{NumPages: 8, TokensPerPage: 4, MaxSeqLen: -1}, "MaxSeqLen"},
	}
	for _, tt := range tests {
		m, err := kvpool.New(tt.cfg)
		if tt.want == "" {
			if err != nil || m == nil {
				t.Errorf("New(%+v) = %v, want success", tt.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want one naming %q", tt.cfg, err, tt.want)
		}
	}
}

// TestLowestIndexFirst is scenario KP-01: pages are taken lowest index
// first, whatever order they were freed in.
func TestLowestIndexFirst(t *testing.T) {
	m := newManager(t, 8, 4)
	a, b, c := req(1, 4, 0), req(2, 4, 0), req(3, 4, 0)
	for _, r := range []*scheduler.Request{a, b, c} {
		if !m.PrepareContext(r) || !m.ResizeContext(r, 4) {
			t.Fatalf("allocation of request %d failed", r.ID)
		}
	}
	if got := [][]int32{m.BlockTable(1), m.BlockTable(2), m.BlockTable(3)}; !slices.EqualFunc(got,
		[][]int32{{0}, {1}, {2}}, slices.Equal) {
		t.Fatalf("first allocation = %v, want [0] [1] [2]", got)
	}
	m.Free(b) // frees page 1
	d := req(4, 8, 0)
	if !m.PrepareContext(d) || !m.ResizeContext(d, 8) {
		t.Fatal("second allocation failed")
	}
	if got := m.BlockTable(4); !slices.Equal(got, []int32{1, 3}) {
		t.Fatalf("second allocation = %v, want [1 3]", got)
	}
	check(t, m)
}

func TestResizeContext(t *testing.T) {
	tests := []struct {
		name      string
		pages     int
		pos, n    int // ContextPosition and chunk
		prior     int // capacity before (0 = fresh)
		wantOK    bool
		wantCap   int
		wantPages int
	}{
		{"fresh chunk", 8, 0, 10, 0, true, 10, 3},
		{"exact pages", 8, 0, 32, 0, true, 32, 8},
		{"one token too many", 8, 0, 33, 0, false, 0, 0},
		{"continuation", 8, 10, 6, 10, true, 16, 4},
		{"never shrinks", 8, 0, 2, 10, true, 10, 3},
		{"zero tokens", 8, 0, 0, 0, true, 0, 0},
		// KS-03: capacity 8 → 13 needs 2 more pages, only 1 free.
		{"all or nothing", 3, 8, 5, 8, false, 8, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newManager(t, tt.pages, 4)
			r := req(1, 100, 0)
			m.PrepareContext(r)
			if tt.prior > 0 && !m.ResizeContext(r, tt.prior) {
				t.Fatal("setup resize failed")
			}
			r.ContextPosition = tt.pos
			freeBefore := m.FreePages()
			if got := m.ResizeContext(r, tt.n); got != tt.wantOK {
				t.Fatalf("ResizeContext = %v, want %v", got, tt.wantOK)
			}
			if got := m.Capacity(1); got != tt.wantCap {
				t.Errorf("capacity = %d, want %d", got, tt.wantCap)
			}
			if got := len(m.BlockTable(1)); got != tt.wantPages {
				t.Errorf("pages = %d, want %d", got, tt.wantPages)
			}
			if !tt.wantOK && m.FreePages() != freeBefore {
				t.Errorf("failed resize changed free pages %d → %d", freeBefore, m.FreePages())
			}
			check(t, m)
		})
	}
}

func TestResizeRequiresActive(t *testing.T) {
	m := newManager(t, 8, 4)
	r := req(1, 8, 0)
	m.PrepareContext(r)
	m.Suspend(r)
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "resize-requires-active") {
			t.Fatalf("panic = %v, want resize-requires-active (KS-02)", p)
		}
	}()
	m.ResizeContext(r, 4)
}

func TestMaxSeqLen(t *testing.T) {
	m, err := kvpool.New(kvpool.Config{NumPages: 100, TokensPerPage: 4, MaxSeqLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.MaxBlocksPerSeq(); got != 8 { // KP-08: ceil(17/4) = 5 → 8
		t.Errorf("MaxBlocksPerSeq = %d, want 8", got)
	}
	r := req(1, 17, 0)
	m.PrepareContext(r)
	if m.ResizeContext(r, 18) {
		t.Error("capacity 18 > MaxSeqLen+1 accepted")
	}
	if !m.ResizeContext(r, 17) {
		t.Error("capacity 17 = MaxSeqLen+1 refused")
	}
	if got := m.AvailableTokens(); got != 16 {
		t.Errorf("AvailableTokens = %d, want MaxSeqLen cap 16", got)
	}
	check(t, m)
}

func TestGenerationGrowthAndRevert(t *testing.T) {
	m := newManager(t, 4, 4)
	r := req(1, 4, 4)
	m.PrepareContext(r)
	m.ResizeContext(r, 4)
	r.ContextPosition = 4
	m.UpdateAfterContext(r)
	r.Generated = 1

	if !m.TryAllocateGeneration(r) {
		t.Fatal("growth failed")
	}
	if got := m.Capacity(1); got != 5 || len(m.BlockTable(1)) != 2 {
		t.Fatalf("capacity %d pages %d, want 5 and 2", got, len(m.BlockTable(1)))
	}
	// H-10 shape: revert restores capacity and pages; a second revert is a no-op.
	m.RevertAllocateGeneration(r)
	m.RevertAllocateGeneration(r)
	if got := m.Capacity(1); got != 4 || len(m.BlockTable(1)) != 1 || m.FreePages() != 3 {
		t.Fatalf("after revert: capacity %d pages %d free %d, want 4, 1, 3", got, len(m.BlockTable(1)), m.FreePages())
	}
	// A step that ran is final: UpdateAfterGeneration clears the record.
	m.TryAllocateGeneration(r)
	r.Generated = 2
	m.UpdateAfterGeneration(r)
	info, _ := m.Sequence(1)
	if info.History != 5 || info.GrowthRecorded {
		t.Fatalf("after step: %+v, want history 5 and no record", info)
	}
	m.RevertAllocateGeneration(r)
	if m.Capacity(1) != 5 {
		t.Fatal("revert after UpdateAfterGeneration changed capacity")
	}
	if m.TryAllocateGeneration(req(99, 1, 1)) {
		t.Error("growth of a request without a cache succeeded")
	}
	check(t, m)
}

// TestGrowthFailureResuspends is KS-09.
func TestGrowthFailureResuspends(t *testing.T) {
	m := newManager(t, 2, 4)
	a, b := req(1, 4, 4), req(2, 4, 4)
	for _, r := range []*scheduler.Request{a, b} {
		m.PrepareContext(r)
		m.ResizeContext(r, 4)
	}
	m.Suspend(a)
	if m.IsActive(1) || !m.HasCache(1) {
		t.Fatal("suspend did not suspend")
	}
	if m.TryAllocateGeneration(a) {
		t.Fatal("growth with no free page succeeded")
	}
	if m.IsActive(1) || m.Capacity(1) != 4 {
		t.Fatalf("failed growth left active=%v capacity=%d", m.IsActive(1), m.Capacity(1))
	}
	m.Free(b)
	if !m.TryAllocateGeneration(a) || !m.IsActive(1) {
		t.Fatal("growth after free did not resume and grow")
	}
	check(t, m)
}

func TestSuspendResumeFree(t *testing.T) {
	m := newManager(t, 8, 4)
	r := req(1, 10, 0)
	m.PrepareContext(r)
	m.ResizeContext(r, 10)
	table := slices.Clone(m.BlockTable(1))
	m.Suspend(r)
	if m.IsActive(1) || !m.HasCache(1) || m.FreePages() != 5 {
		t.Fatalf("suspended: active=%v cache=%v free=%d; pages must stay held without a host tier",
			m.IsActive(1), m.HasCache(1), m.FreePages())
	}
	check(t, m)
	if !m.PrepareContext(r) || !m.IsActive(1) || !slices.Equal(m.BlockTable(1), table) {
		t.Fatal("resume did not restore the same block table")
	}
	m.Free(r)
	m.Free(r) // KS-08: idempotent
	if m.HasCache(1) || m.FreePages() != 8 || m.BlockTable(1) != nil {
		t.Fatal("free did not release everything")
	}
	check(t, m)
}

func TestReleaseContextAdmission(t *testing.T) {
	m := newManager(t, 8, 4)
	r := req(1, 10, 0)
	m.PrepareContext(r)
	m.ResizeContext(r, 8)
	r.ContextPosition = 3
	m.ReleaseContextAdmission(r)
	if m.HasCache(1) || r.ContextPosition != 0 || m.FreePages() != 8 {
		t.Fatalf("cache %v position %d free %d", m.HasCache(1), r.ContextPosition, m.FreePages())
	}
	check(t, m)
}

func TestGuaranteedNoEvict(t *testing.T) {
	m := newManager(t, 10, 4)
	a := req(1, 8, 8) // 4 pages to completion
	if got := m.PagesToCompletion(a); got != 4 {
		t.Fatalf("PagesToCompletion = %d, want 4", got)
	}
	m.PrepareContext(a)
	if !m.PrepareBlocksIfSchedulable(a, 4) {
		t.Fatal("admission of a failed")
	}
	// 1 page allocated, 3 reserved: 6 available.
	if m.FreePages() != 9 || m.ReservedPages() != 3 || m.AvailableTokens() != 24 {
		t.Fatalf("free %d reserved %d available %d", m.FreePages(), m.ReservedPages(), m.AvailableTokens())
	}
	b := req(2, 20, 8) // 7 pages > 6 available: refused, unchanged
	m.PrepareContext(b)
	if m.PrepareBlocksIfSchedulable(b, 4) {
		t.Fatal("admission of b succeeded beyond the reservations")
	}
	if !m.HasCache(2) || m.FreePages() != 9 || m.ReservedPages() != 3 {
		t.Fatal("failed admission changed state")
	}
	m.ReleaseContextAdmission(b)
	// Another request cannot take reserved pages on demand either.
	c := req(3, 28, 0)
	m.PrepareContext(c)
	if m.ResizeContext(c, 28) { // 7 pages > 6 unreserved
		t.Fatal("on-demand allocation ate into a reservation")
	}
	if !m.ResizeContext(c, 24) {
		t.Fatal("on-demand allocation of the unreserved pages failed")
	}
	// a's remaining growth draws from its reservation and cannot fail.
	a.ContextPosition = 4
	if !m.ResizeContext(a, 4) {
		t.Fatal("continuation failed")
	}
	a.ContextPosition = 8
	for i := range 7 {
		if !m.TryAllocateGeneration(a) {
			t.Fatalf("generation step %d failed under a reservation", i)
		}
		check(t, m)
	}
	if m.ReservedPages() != 0 || m.FreePages() != 0 {
		t.Fatalf("reservation not consumed: reserved %d free %d", m.ReservedPages(), m.FreePages())
	}
	m.Free(a)
	if m.ReservedPages() != 0 || m.FreePages() != 4 {
		t.Fatal("close did not release")
	}
	check(t, m)
}

func TestGuaranteedNoEvictReleasedOnClose(t *testing.T) {
	m := newManager(t, 10, 4)
	a := req(1, 4, 32)                       // 9 pages
	if !m.PrepareBlocksIfSchedulable(a, 4) { // creates the cache itself
		t.Fatal("admission failed")
	}
	if m.ReservedPages() != 8 {
		t.Fatalf("reserved %d, want 8", m.ReservedPages())
	}
	m.Free(a)
	if m.ReservedPages() != 0 || m.AvailableTokens() != 40 {
		t.Fatalf("reserved %d available %d after close", m.ReservedPages(), m.AvailableTokens())
	}
	big := req(2, 40, 4) // 11 pages > 10: never fits, no cache left behind
	if m.PrepareBlocksIfSchedulable(big, 4) || m.HasCache(2) {
		t.Fatal("impossible admission succeeded or left a cache")
	}
	check(t, m)
}

func TestAddDummy(t *testing.T) {
	m := newManager(t, 2, 4)
	d := req(1<<63, 1, 1)
	if !m.AddDummy(d, 1) || !m.IsActive(d.ID) || m.Capacity(d.ID) != 1 {
		t.Fatal("AddDummy failed")
	}
	if info, _ := m.Sequence(d.ID); !info.Dummy {
		t.Error("dummy not marked")
	}
	if m.AddDummy(d, 1) {
		t.Error("second dummy with the same id accepted")
	}
	if m.AddDummy(req(1<<63+1, 1, 1), 5) { // 2 pages, 1 free
		t.Error("dummy beyond free pages accepted")
	}
	if m.HasCache(1<<63+1) || m.FreePages() != 1 {
		t.Error("failed dummy not rolled back")
	}
	m.Free(d)
	check(t, m)
}

func TestHistoryBookkeeping(t *testing.T) {
	m := newManager(t, 20, 4)
	r := req(1, 10, 50)
	m.PrepareContext(r)
	m.ResizeContext(r, 6)
	r.ContextPosition = 6
	m.UpdateAfterContext(r)
	if info, _ := m.Sequence(1); info.History != 6 || info.Committed != 0 {
		t.Fatalf("after chunk 1: %+v", info)
	}
	m.ResizeContext(r, 4)
	r.ContextPosition = 10
	r.Generated = 1
	m.UpdateAfterContext(r)
	for range 45 {
		m.TryAllocateGeneration(r)
		r.Generated++
		m.UpdateAfterGeneration(r)
	}
	// KS-11: 55 tokens → history 54, capacity unchanged by the update.
	if info, _ := m.Sequence(1); info.History != 55 || info.Capacity != 55 {
		t.Fatalf("after generation: %+v, want history = capacity = 55", info)
	}
	r.Generated-- // an update that would move history back is ignored
	m.UpdateAfterGeneration(r)
	if info, _ := m.Sequence(1); info.History != 55 {
		t.Fatalf("history decreased: %+v", info)
	}
	check(t, m)
}

func TestQueriesAndConstants(t *testing.T) {
	m := newManager(t, 6, 16)
	if m.TotalPages() != 6 || m.TokensPerPage() != 16 || m.AvailableTokens() != 96 {
		t.Error("wrong sizes")
	}
	if m.HasHostTier() || m.BlockReuseEnabled() || m.ReusePolicy() != scheduler.PerRequest {
		t.Error("wrong feature flags")
	}
	if _, ok := m.ProbeFirstNewBlockKey(req(1, 100, 1)); ok {
		t.Error("probe returned a key without reuse")
	}
	if m.BlockTable(7) != nil || m.Capacity(7) != 0 || m.IsActive(7) || m.HasCache(7) {
		t.Error("unknown id has state")
	}
}

func TestClose(t *testing.T) {
	m := newManager(t, 6, 4)
	a, b := req(1, 8, 0), req(2, 8, 4)
	m.PrepareContext(a)
	m.ResizeContext(a, 8)
	m.PrepareBlocksIfSchedulable(b, 8)
	m.Suspend(a)
	m.Close()
	if m.FreePages() != 6 || m.ReservedPages() != 0 || m.NumSequences() != 0 {
		t.Fatal("close left state behind")
	}
	if m.PrepareContext(req(3, 1, 1)) || m.AddDummy(req(4, 1, 1), 1) || m.PrepareBlocksIfSchedulable(req(5, 1, 1), 1) {
		t.Fatal("cache created after Close")
	}
	check(t, m)
}

// TestDeterministicPages runs the same call sequence on two managers (two
// "ranks") and expects identical block tables.
func TestDeterministicPages(t *testing.T) {
	run := func() [][]int32 {
		m := newManager(t, 32, 4)
		var out [][]int32
		for i := uint64(0); i < 12; i++ {
			r := req(i, int(i%5)*3+1, 2)
			m.PrepareContext(r)
			m.ResizeContext(r, r.PromptLen)
			if i%3 == 0 {
				m.Free(req(i/2, 0, 0))
			}
		}
		for i := uint64(0); i < 12; i++ {
			out = append(out, slices.Clone(m.BlockTable(i)))
		}
		return out
	}
	a, b := run(), run()
	if !slices.EqualFunc(a, b, slices.Equal) {
		t.Fatalf("block tables differ:\n%v\n%v", a, b)
	}
}
