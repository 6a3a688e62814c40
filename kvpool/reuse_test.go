package kvpool_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// warmTree returns a manager whose radix tree is [1,2,3,4] → [5,6,7,8]
// (both cached), as in the examples of kvcache.md §6.3.
func warmTree(t *testing.T, mut func(*kvpool.Config)) *kvpool.Manager {
	cfg := reuseCfg(16)
	if mut != nil {
		mut(&cfg)
	}
	m := newCfg(t, cfg)
	runAndFree(t, m, preq(100, span(1, 8), 1))
	if m.CachedPages() != 2 {
		t.Fatalf("cached pages %d, want 2", m.CachedPages())
	}
	return m
}

// TestMatchExamples is KR-02 (and the position/remaining column of §6.3).
func TestMatchExamples(t *testing.T) {
	tests := []struct {
		prompt       []int32
		m, remaining int
	}{
		{[]int32{1, 2, 3, 4, 5, 6, 9, 10, 11}, 6, 3},
		{span(1, 8), 7, 1},
		{span(1, 4), 3, 1},
		{[]int32{9, 9, 9, 9, 9}, 0, 5},
	}
	for _, tt := range tests {
		m := warmTree(t, nil)
		r := preq(1, tt.prompt, 1)
		if got := m.ProbeReuse(r); got != tt.m {
			t.Errorf("%v: ProbeReuse = %d, want %d", tt.prompt, got, tt.m)
		}
		if !m.PrepareContext(r) {
			t.Fatalf("%v: PrepareContext failed", tt.prompt)
		}
		if r.ContextPosition != tt.m || r.Remaining() != tt.remaining {
			t.Errorf("%v: position %d remaining %d, want %d / %d", tt.prompt, r.ContextPosition, r.Remaining(), tt.m, tt.remaining)
		}
		mustCheck(t, m)
	}
}

// TestPartialReuseOff is KR-03.
func TestPartialReuseOff(t *testing.T) {
	m := warmTree(t, func(c *kvpool.Config) { c.DisablePartialReuse = true })
	if got := m.ProbeReuse(preq(1, span(1, 8), 1)); got != 4 {
		t.Fatalf("m = %d, want 4", got)
	}
}

// TestPartialChildrenLimit is KR-04: no partial match under a node with 32
// or more children.
func TestPartialChildrenLimit(t *testing.T) {
	for _, children := range []int{31, 32} {
		m := newCfg(t, reuseCfg(200))
		runAndFree(t, m, preq(1000, []int32{1, 2, 3, 4, 5, 6, 0, 0}, 1))
		for i := 1; i < children; i++ {
			x := int32(100 + 4*i)
			runAndFree(t, m, preq(uint64(1000+i), cat(span(1, 4), span(x, x+3)), 1))
		}
		got := m.ProbeReuse(preq(1, span(1, 9), 1))
		want := 6
		if children == 32 {
			want = 4
		}
		if got != want {
			t.Errorf("%d children: m = %d, want %d", children, got, want)
		}
	}
}

// TestMatchStopsAtHostBlock is KR-05.
func TestMatchStopsAtHostBlock(t *testing.T) {
	cfg := reuseCfg(4)
	cfg.HostPages = 4
	m := newCfg(t, cfg)
	a := preq(1, cat(span(1, 8), []int32{9}), 1)
	prefill(t, m, a)
	m.Suspend(a)
	b := preq(2, span(50, 65), 1) // 4 pages: 1 free + 3 migrated
	chunk(t, m, b, 16)
	if info(t, m, 1).HostPages != 3 {
		t.Fatalf("A has %d host pages, want 3", info(t, m, 1).HostPages)
	}
	if got := m.ProbeReuse(preq(3, cat(span(1, 8), []int32{10}), 1)); got != 0 {
		t.Fatalf("m = %d, want 0 (the first block is on the host)", got)
	}
	mustCheck(t, m)
}

// TestRebase is KR-06: the second commit of an identical full block
// rebases onto the first page and frees its own; one stored event.
func TestRebase(t *testing.T) {
	m := newCfg(t, reuseCfg(8))
	m.FlushIterationEvents()
	a, b := preq(1, cat(span(1, 4), []int32{5}), 1), preq(2, cat(span(1, 4), []int32{6}), 1)
	for _, r := range []*scheduler.Request{a, b} {
		m.PrepareContext(r)
		m.ResizeContext(r, r.PromptLen)
	}
	free := m.FreePages()
	a.ContextPosition = 5
	m.UpdateAfterContext(a)
	b.ContextPosition = 5
	m.UpdateAfterContext(b)
	if m.BlockTable(2)[0] != m.BlockTable(1)[0] {
		t.Fatalf("B's block 0 is page %d, A's %d: no rebase", m.BlockTable(2)[0], m.BlockTable(1)[0])
	}
	if m.FreePages() != free+1 {
		t.Fatalf("free %d, want %d (B's private page freed)", m.FreePages(), free+1)
	}
	var full int
	for _, k := range storedKeys(eventsOf(m, kvpool.EventStored)) {
		if k == kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4)) {
			full++
		}
	}
	if full != 1 {
		t.Fatalf("%d stored events for [1,2,3,4], want 1", full)
	}
	mustCheck(t, m)
}

// TestChunkBoundariesPublishSameKeys is KR-07.
func TestChunkBoundariesPublishSameKeys(t *testing.T) {
	var want []scheduler.BlockKey
	for i, bounds := range [][]int{{12}, {4, 12}, {4, 9, 12}, {7, 12}, {11, 12}} {
		m := newCfg(t, reuseCfg(8))
		r := preq(1, span(0, 11), 1)
		for _, end := range bounds {
			chunk(t, m, r, end)
		}
		got := storedKeys(eventsOf(m, kvpool.EventStored))
		if i == 0 {
			want = got
			if len(want) != 3 {
				t.Fatalf("%d keys published, want 3", len(want))
			}
		} else if !slices.Equal(got, want) {
			t.Errorf("chunks %v published different keys", bounds)
		}
	}
}

// TestCommitPolicies is KR-08, KR-09, KR-10 and KS-10.
func TestCommitPolicies(t *testing.T) {
	type lens struct{ committed, history int }
	tests := []struct {
		name   string
		policy scheduler.ReusePolicy
		conv   string
		prompt int
		bounds []int
		want   []lens
	}{
		{"KR-08 per request", scheduler.PerRequest, "", 12, []int{4, 12}, []lens{{0, 4}, {12, 12}}},
		{"KR-09 per conversation", scheduler.PerConversation, "c", 8, []int{4, 8}, []lens{{0, 4}, {8, 8}}},
		{"KR-10 no conversation id", scheduler.PerConversation, "", 12, []int{4, 12}, []lens{{0, 4}, {12, 12}}},
		{"KS-10 all reusable", scheduler.AllReusable, "", 10, []int{4, 10}, []lens{{4, 4}, {10, 10}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := reuseCfg(8)
			cfg.ReusePolicy = tt.policy
			m := newCfg(t, cfg)
			r := preq(1, span(0, int32(tt.prompt-1)), 1)
			r.ConversationID = tt.conv
			for i, end := range tt.bounds {
				chunk(t, m, r, end)
				s := info(t, m, 1)
				if (lens{s.Committed, s.History}) != tt.want[i] {
					t.Fatalf("after chunk %d: committed %d history %d, want %v", i+1, s.Committed, s.History, tt.want[i])
				}
			}
			if !info(t, m, 1).Stopped {
				t.Error("committing not stopped at context end")
			}
			mustCheck(t, m)
		})
	}
}

// convManager is a PER_CONVERSATION manager with maxTurns.
func convManager(t *testing.T, maxTurns int) *kvpool.Manager {
	cfg := reuseCfg(64)
	cfg.ReusePolicy = scheduler.PerConversation
	cfg.MaxNumTurns = maxTurns
	return newCfg(t, cfg)
}

// convReq is a request of conversation conv.
func convReq(id uint64, conv string, tokens []int32) *scheduler.Request {
	r := preq(id, tokens, 1)
	r.ConversationID = conv
	return r
}

// TestDropPlanOneTurn is KR-11 (and EV-14's pre-order on a real plan).
func TestDropPlanOneTurn(t *testing.T) {
	m := convManager(t, 1)
	runAndFree(t, m, convReq(1, "conv-1", span(0, 7)))
	b := convReq(2, "conv-1", cat(span(0, 7), span(100, 103)))
	if got := m.ProbeReuse(b); got != 8 {
		t.Fatalf("B matches %d, want 8", got)
	}
	m.FlushIterationEvents()
	runAndFree(t, m, b)
	removed := eventsOf(m, kvpool.EventRemoved)
	if len(removed) != 1 || len(removed[0].Hashes) != 3 {
		t.Fatalf("removed events %+v, want one with A's 2 blocks and B's block", removed)
	}
	if got := m.ProbeReuse(convReq(3, "conv-2", span(0, 7))); got != 0 {
		t.Fatalf("conv-2 matches %d, want 0", got)
	}
	if m.CachedPages() != 0 {
		t.Fatalf("%d cached pages left", m.CachedPages())
	}
}

// TestDropPlanTwoTurns is KR-12.
func TestDropPlanTwoTurns(t *testing.T) {
	m := convManager(t, 2)
	runAndFree(t, m, convReq(1, "conv-1", span(0, 7)))
	runAndFree(t, m, convReq(2, "conv-1", span(100, 107)))
	if got := m.ProbeReuse(convReq(9, "conv-3", span(0, 7))); got != 7 {
		t.Fatalf("probe after two turns = %d, want 7", got)
	}
	runAndFree(t, m, convReq(3, "conv-1", span(200, 207)))
	if got := m.ProbeReuse(convReq(9, "conv-3", span(0, 7))); got != 0 {
		t.Fatalf("probe after three turns = %d, want 0", got)
	}
}

// TestConcurrentConversationRequest is KR-13.
func TestConcurrentConversationRequest(t *testing.T) {
	m := convManager(t, 1)
	a := convReq(1, "conv-1", span(0, 7))
	chunk(t, m, a, 4)
	b := convReq(2, "conv-1", cat(span(0, 3), span(100, 103)))
	prefill(t, m, b)
	notes := m.TakeNotes()
	if len(notes) != 1 || !strings.Contains(notes[0], "current request 1") || !strings.Contains(notes[0], "Request 2") {
		t.Fatalf("notes %q, want one warning naming requests 1 and 2", notes)
	}
	m.Free(b)
	chunk(t, m, a, 8)
	m.Free(a)
	if got := m.ProbeReuse(convReq(3, "conv-2", span(0, 7))); got != 7 {
		t.Fatalf("conv-2 probe = %d, want 7", got)
	}
	mustCheck(t, m)
}

// TestCancelledConversationRequest is KR-14.
func TestCancelledConversationRequest(t *testing.T) {
	m := convManager(t, 1)
	a := convReq(1, "conv-1", span(0, 7))
	chunk(t, m, a, 4)
	m.Free(a)
	runAndFree(t, m, convReq(2, "conv-1", span(0, 7)))
	if notes := m.TakeNotes(); len(notes) != 0 {
		t.Fatalf("warnings %q after a cancellation", notes)
	}
}

// TestReuseOff is KR-15.
func TestReuseOff(t *testing.T) {
	cfg := reuseCfg(16)
	cfg.EnableBlockReuse = false
	m := newCfg(t, cfg)
	runAndFree(t, m, preq(1, span(1, 8), 1))
	r := preq(2, span(1, 8), 1)
	if m.ProbeReuse(r) != 0 {
		t.Fatal("match with reuse off")
	}
	prefill(t, m, r)
	if info(t, m, 2).Committed != 0 || len(eventsOf(m, kvpool.EventStored)) != 0 || m.CachedPages() != 0 {
		t.Fatal("reuse off committed or stored something")
	}
	if _, ok := m.ProbeFirstNewBlockKey(r); ok {
		t.Fatal("probe key with reuse off")
	}
}

// TestCreateWithMatchIsSuspended is KS-01: a cache created with a 6-token
// match starts with all lengths 6 and SUSPENDED (here the copy-on-resume
// page is missing, so the resume inside PrepareContext is refused).
func TestCreateWithMatchIsSuspended(t *testing.T) {
	cfg := reuseCfg(3)
	m := newCfg(t, cfg)
	// The owner of [1..4] → [5..8] keeps running, so the partial block is
	// shared: r must copy it (it cannot adopt it, see TestAdoptPartialWhenShort).
	prefill(t, m, preq(100, span(1, 8), 1))
	hog := preq(50, span(60, 63), 1)
	prefill(t, m, hog) // the last page
	r := preq(1, []int32{1, 2, 3, 4, 5, 6, 9, 10, 11}, 1)
	if m.PrepareContext(r) {
		t.Fatal("resume succeeded without a page for the copy")
	}
	s := info(t, m, 1)
	if s.Status != kvpool.SeqSuspended || s.Committed != 6 || s.History != 6 || s.Capacity != 6 || r.ContextPosition != 6 {
		t.Fatalf("got %+v position %d", s, r.ContextPosition)
	}
	mustCheck(t, m)
	m.Free(hog)
	if !m.PrepareContext(r) || !m.IsActive(1) {
		t.Fatal("resume after a page freed failed")
	}
	copies := m.TakeCopies()
	if len(copies) != 1 || copies[0].SrcTier != kvpool.TierGPU || copies[0].DstTier != kvpool.TierGPU {
		t.Fatalf("copies %+v, want one GPU→GPU copy-on-resume", copies)
	}
	mustCheck(t, m)
}

// TestProbeFirstNewBlockKey covers §6.3's ProbeFirstNewBlockKey.
func TestProbeFirstNewBlockKey(t *testing.T) {
	m := warmTree(t, nil)
	// The probe names blocks by their lookup keys (LookupKeyOf), not their
	// event hashes.
	k2 := kvpool.LookupKeyOf(kvpool.LookupKeyOf(kvpool.LookupRootKey(""), span(1, 4)), span(5, 8))
	k3 := kvpool.LookupKeyOf(k2, span(9, 12))
	if _, ok := m.ProbeFirstNewBlockKey(preq(1, span(1, 8), 1)); ok {
		t.Error("lookup [1..7] has no unmatched full block, got a key")
	}
	if key, ok := m.ProbeFirstNewBlockKey(preq(1, span(1, 13), 1)); !ok || key != k3 {
		t.Error("first new block of [1..13] is not [9..12]")
	}
	m2 := newCfg(t, reuseCfg(8))
	if key, ok := m2.ProbeFirstNewBlockKey(preq(1, span(1, 13), 1)); !ok || key != kvpool.LookupKeyOf(kvpool.LookupRootKey(""), span(1, 4)) {
		t.Error("cold tree: first new block is not the first block")
	}
}

// TestEvictionFeedsAllocation checks that cached pages count as available
// and are dropped on demand (AvailableTokens consistent with reuse).
func TestEvictionFeedsAllocation(t *testing.T) {
	m := warmTree(t, func(c *kvpool.Config) { c.NumPages = 4 })
	if m.FreePages() != 2 || m.AvailableTokens() != 16 {
		t.Fatalf("free %d available %d, want 2 and 16", m.FreePages(), m.AvailableTokens())
	}
	r := preq(1, span(20, 35), 1)
	prefill(t, m, r)
	if m.CachedPages() != 0 || m.FreePages() != 0 {
		t.Fatalf("cached %d free %d after a 4-page allocation", m.CachedPages(), m.FreePages())
	}
	mustCheck(t, m)
}

// TestSaltIsolatesTenants: requests with different salts share nothing.
func TestSaltIsolatesTenants(t *testing.T) {
	cfg := reuseCfg(16)
	cfg.CacheSalt = func(r *scheduler.Request) string { return r.ConversationID }
	m := newCfg(t, cfg)
	a := preq(1, span(1, 9), 1)
	a.ConversationID = "tenant-a"
	runAndFree(t, m, a)
	b := preq(2, span(1, 9), 1)
	if m.ProbeReuse(b) != 0 {
		t.Fatal("unsalted request reused a salted prefix")
	}
	b.ConversationID = "tenant-a"
	if m.ProbeReuse(b) != 8 {
		t.Fatal("same salt did not reuse")
	}
}

// TestAdoptPartialWhenShort (issue 9, defect 1): a request that fits the
// pool alone must not need a page more because it matched. A 3-page pool
// holds a finished request's blocks [1..4] → [5..8] (cached) and a hog on the
// last page. r (7 tokens: 2 pages) matches [1..4] fully and [5,6] of [5..8]
// partially: the copy of §6.4 would need a third page for r, but r alone
// references [5..8], which without r would be an evictable cached block. r
// takes that page over instead: no copy, the block leaves the tree with a
// removed event, and its content (the first q tokens) serves r.
func TestAdoptPartialWhenShort(t *testing.T) {
	m := newCfg(t, reuseCfg(3))
	runAndFree(t, m, preq(100, span(1, 8), 1))
	hog := preq(50, span(60, 63), 1)
	prefill(t, m, hog)
	m.FlushIterationEvents()
	partialKey := kvpool.BlockKeyOf(kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4)), span(5, 8))
	r := preq(1, []int32{1, 2, 3, 4, 5, 6, 9}, 1)
	if !m.PrepareContext(r) {
		t.Fatal("resume refused although r alone holds the partial block")
	}
	if r.ContextPosition != 6 {
		t.Fatalf("position %d, want 6 (the match is kept)", r.ContextPosition)
	}
	if c := m.TakeCopies(); len(c) != 0 {
		t.Fatalf("copies %+v, want none (the page is adopted)", c)
	}
	removed := eventsOf(m, kvpool.EventRemoved)
	if len(removed) != 1 || len(removed[0].Hashes) != 1 || removed[0].Hashes[0] != partialKey {
		t.Fatalf("removed events %+v, want one for [5..8]", removed)
	}
	if got := m.ProbeReuse(preq(2, span(1, 8), 1)); got != 4 {
		t.Fatalf("match of [1..7] = %d after [5..8] was adopted, want 4", got)
	}
	// r owns the page now: it writes the rest of its prompt in place.
	if !m.ResizeContext(r, r.PromptLen-r.ContextPosition) {
		t.Fatal("ResizeContext after adoption failed")
	}
	mustCheck(t, m)
	m.Free(r)
	m.Free(hog)
	mustCheck(t, m)
	if m.FreePages()+m.CachedPages() != 3 {
		t.Fatalf("free %d + cached %d, want 3", m.FreePages(), m.CachedPages())
	}
}

// TestAdoptPartialOfFullBlockDropsCachedDescendants: the partial match may
// be a prefix of a full block with cached descendants. Here a
// GUARANTEED_NO_EVICT reservation covers the only page the copy could take,
// so r adopts [5..8]; its cached child [9..12] is evicted first (nobody uses
// it: a user would hold [5..8] too).
func TestAdoptPartialOfFullBlockDropsCachedDescendants(t *testing.T) {
	m := newCfg(t, reuseCfg(4))
	runAndFree(t, m, preq(100, span(1, 12), 1)) // [1..4] → [5..8] → [9..12] cached, 1 free
	x := preq(50, []int32{60, 61}, 6)           // 2 pages to completion: 1 now, 1 reserved
	if !m.PrepareBlocksIfSchedulable(x, 2) || m.ReservedPages() != 1 {
		t.Fatalf("GNE admission of x: reserved %d", m.ReservedPages())
	}
	m.FlushIterationEvents()
	r := preq(1, []int32{1, 2, 3, 4, 5, 6, 7, 20}, 1) // 2 pages
	if !m.PrepareContext(r) || r.ContextPosition != 7 {
		t.Fatalf("resume refused or match lost: position %d", r.ContextPosition)
	}
	if c := m.TakeCopies(); len(c) != 0 {
		t.Fatalf("copies %+v, want none (the page is adopted)", c)
	}
	k1 := kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4))
	k2 := kvpool.BlockKeyOf(k1, span(5, 8))
	k3 := kvpool.BlockKeyOf(k2, span(9, 12))
	var removed []scheduler.BlockKey
	for _, e := range eventsOf(m, kvpool.EventRemoved) {
		removed = append(removed, e.Hashes...)
	}
	if len(removed) != 2 || removed[0] != k3 || removed[1] != k2 {
		t.Fatalf("removed %x, want [9..12] then [5..8]", removed)
	}
	if !m.ResizeContext(r, r.PromptLen-r.ContextPosition) {
		t.Fatal("ResizeContext after adoption failed")
	}
	mustCheck(t, m)
	m.Free(r)
	m.Free(x)
	mustCheck(t, m)
}
