package kvpool_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// KV cache event scenarios (kvcache.md §11.5). EV-05…07 are internal tests
// (events_internal_test.go), EV-13 is in keys_test.go, EV-15 in
// pool_test.go; EV-12 (GetLatestEvents waiting) belongs to the executor,
// which owns the goroutines.

// TestCreatedEvent is EV-01 and EV-08.
func TestCreatedEvent(t *testing.T) {
	m := newCfg(t, kvpool.Config{NumPages: 1000, TokensPerPage: 4, HostPages: 2000, EventBufferMaxSize: 8})
	evs := m.FlushIterationEvents()
	if len(evs) != 1 || evs[0].ID != 0 || evs[0].Kind != kvpool.EventCreated ||
		!slices.Equal(evs[0].BlocksPerLevel, []int{1000, 2000}) {
		t.Fatalf("events %+v, want created [1000 2000] id 0", evs)
	}
	off := newCfg(t, kvpool.Config{NumPages: 8, TokensPerPage: 4, EnableBlockReuse: true})
	runAndFree(t, off, preq(1, span(1, 9), 1))
	if evs := off.FlushIterationEvents(); len(evs) != 0 || off.EventsEnabled() {
		t.Fatalf("EV-08: events with size 0: %+v", evs)
	}
}

// TestStoredCoalescing is EV-02 and EV-03.
func TestStoredCoalescing(t *testing.T) {
	m := newCfg(t, reuseCfg(16))
	m.FlushIterationEvents()
	prefill(t, m, preq(1, span(1, 12), 1))
	stored := eventsOf(m, kvpool.EventStored)
	if len(stored) != 1 || len(stored[0].Blocks) != 3 || stored[0].HasParent {
		t.Fatalf("EV-02: %+v, want one stored with 3 blocks", stored)
	}
	prefill(t, m, preq(2, span(50, 53), 1)) // a root child: no parent
	prefill(t, m, preq(3, span(1, 16), 1))  // reuses h1…h3, commits h4 under h3
	stored = eventsOf(m, kvpool.EventStored)
	h3 := kvpool.BlockKeyOf(kvpool.BlockKeyOf(kvpool.BlockKeyOf(kvpool.RootKey(""), span(1, 4)), span(5, 8)), span(9, 12))
	if len(stored) != 2 || stored[0].HasParent || !stored[1].HasParent || stored[1].Parent != h3 {
		t.Fatalf("EV-03: %+v, want two stored events, the second under h3", stored)
	}
	mustCheck(t, m)
}

// TestRemovedCoalescing is EV-04: two evictions in one iteration give one
// removed event at drain.
func TestRemovedCoalescing(t *testing.T) {
	m := newCfg(t, reuseCfg(2))
	runAndFree(t, m, preq(1, span(1, 4), 1))
	runAndFree(t, m, preq(2, span(11, 14), 1))
	m.FlushIterationEvents()
	prefill(t, m, preq(3, span(100, 107), 1))
	removed := eventsOf(m, kvpool.EventRemoved)
	if len(removed) != 1 || len(removed[0].Hashes) != 2 {
		t.Fatalf("removed %+v, want one event with 2 hashes", removed)
	}
}

// TestDropPlanPreOrder is EV-14: a drop plan removing b1, whose children
// are b2 (with child b3) and b4, in that insertion order.
func TestDropPlanPreOrder(t *testing.T) {
	m := convManager(t, 1)
	runAndFree(t, m, convReq(1, "conv-1", span(0, 3)))          // b1, conv-1's plan
	runAndFree(t, m, preq(2, span(0, 11), 1))                   // b2 = [4..7], b3 = [8..11]
	runAndFree(t, m, preq(3, cat(span(0, 3), span(20, 23)), 1)) // b4
	m.FlushIterationEvents()
	runAndFree(t, m, convReq(4, "conv-1", span(500, 503))) // next turn drops b1's subtree
	root := kvpool.RootKey("")
	b1 := kvpool.BlockKeyOf(root, span(0, 3))
	b2 := kvpool.BlockKeyOf(b1, span(4, 7))
	b3 := kvpool.BlockKeyOf(b2, span(8, 11))
	b4 := kvpool.BlockKeyOf(b1, span(20, 23))
	removed := eventsOf(m, kvpool.EventRemoved)
	if len(removed) != 1 || !slices.Equal(removed[0].Hashes, []scheduler.BlockKey{b1, b2, b3, b4}) {
		t.Fatalf("removed %+v, want one [b1 b2 b3 b4]", removed)
	}
	mustCheck(t, m)
}

// mkEvents returns n events with ids from, from+1, ….
func mkEvents(from, n int) []kvpool.Event {
	var out []kvpool.Event
	for i := range n {
		out = append(out, kvpool.Event{ID: uint64(from + i), Kind: kvpool.EventRemoved})
	}
	return out
}

func ids(evs []kvpool.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

// TestPublisher is EV-09, EV-10 and EV-11.
func TestPublisher(t *testing.T) {
	// EV-09: no attention-DP, max 8: ids 3…10 of 1…10 are published.
	p := kvpool.NewEventPublisher(8, 1)
	p.Publish(mkEvents(0, 1))
	p.Take()
	kept, cut := kvpool.LastEvents(mkEvents(1, 10), 8)
	p.Publish(kept)
	if got := ids(p.Take()); !slices.Equal(got, []uint64{3, 4, 5, 6, 7, 8, 9, 10}) || cut != 2 {
		t.Fatalf("EV-09: published %v (cut %d)", got, cut)
	}
	// EV-10: attention-DP, 2 ranks: rank 0's last 8 then rank 1's 3.
	p = kvpool.NewEventPublisher(8, 2)
	r0, r1 := mkEvents(0, 10), mkEvents(100, 3)
	p.Publish(r0, r1)
	got := ids(p.Take())
	want := append(ids(r0[2:]), ids(r1)...)
	if p.Capacity() != 16 || !slices.Equal(got, want) {
		t.Fatalf("EV-10: capacity %d, published %v, want %v", p.Capacity(), got, want)
	}
	// EV-11: three iterations of 8 + 8 without a reader.
	for it := range 3 {
		p.Publish(mkEvents(1000*it, 8), mkEvents(1000*it+500, 8))
	}
	if got := ids(p.Take()); len(got) != 16 || got[0] != 2000 || p.Dropped() != 32 {
		t.Fatalf("EV-11: deque %v, dropped %d", got, p.Dropped())
	}
}

// TestEventSequenceContiguous: ids are contiguous across flushes.
func TestEventSequenceContiguous(t *testing.T) {
	m := newCfg(t, reuseCfg(4))
	var all []kvpool.Event
	for i := range 6 {
		runAndFree(t, m, preq(uint64(i), span(int32(10*i), int32(10*i+8)), 1))
		all = append(all, m.FlushIterationEvents()...)
	}
	for i, e := range all {
		if e.ID != uint64(i) {
			t.Fatalf("event %d has id %d", i, e.ID)
		}
	}
	if m.NextEventID() != uint64(len(all)) {
		t.Fatalf("NextEventID %d, want %d", m.NextEventID(), len(all))
	}
}

// TestEventJSONL checks the record format of the --kv-events file.
func TestEventJSONL(t *testing.T) {
	cfg := reuseCfg(8)
	cfg.AttentionDP, cfg.AttentionDPRank = true, 1
	m := newCfg(t, cfg)
	prefill(t, m, preq(1, span(1, 4), 1))
	var out []byte
	for _, e := range m.FlushIterationEvents() {
		out = e.AppendJSONL(out, 7, 1)
	}
	want := `{"iteration":7,"rank":1,"seq":0,"type":"created","window_size":1000,"hash_algo":"sha256_64","attention_dp_rank":1,"blocks_per_level":[8]}
{"iteration":7,"rank":1,"seq":1,"type":"stored","window_size":1000,"hash_algo":"sha256_64","attention_dp_rank":1,"parent_hash":null,"blocks":[{"hash":16443243144690205867,"tokens":[1,2,3,4],"cache_level":0,"priority":35}]}
`
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	e := kvpool.Event{Kind: kvpool.EventRemoved, HashAlgo: kvpool.HashSHA256, Hashes: []scheduler.BlockKey{{0xab}}}
	if line := string(e.AppendJSONL(nil, 0, 0)); !strings.Contains(line, `"hashes":["ab00`) {
		t.Fatalf("sha256 rendering: %s", line)
	}
}
