package kvpool_test

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// FuzzPoolOperations drives a Manager with random operation sequences
// (allocate, grow, commit, match, suspend, resume, free, evict) decoded from
// the input and checks after every step:
//
//   - CheckInvariants: no page leaked or double-owned, reference counts,
//     lengths, the tree, the leaf heap, reservations;
//   - page contents: a simulated device (page memory, copies applied in
//     list order at each drain, forwards writing token ids) must hold every
//     active sequence's tokens at its positions, whatever was reused,
//     rebased, migrated or copied on resume;
//   - events: ids contiguous across flushes; stored only for a block not
//     live, removed only for a live one, and at the end the live set equals
//     the tree (ReusableBlocks);
//   - match: ProbeReuse equals a naive match computed from the event stream
//     alone (the reference model of the radix tree).
//
// The seed corpus runs with plain `go test`.
func FuzzPoolOperations(f *testing.F) {
	rng := rand.New(rand.NewSource(7))
	for i := range 24 {
		b := make([]byte, 40+i*12)
		rng.Read(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		newHarness(t, data).run()
	})
}

// fuzzReq is a request of the harness with what its pages must hold.
type fuzzReq struct {
	r       *scheduler.Request
	gen     []int32 // generated tokens
	written int     // positions whose KV must be on its pages
}

// token is the expected token at position p.
func (q *fuzzReq) token(p int) int32 {
	if p < q.r.PromptLen {
		return q.r.Tokens[p]
	}
	return q.gen[p-q.r.PromptLen]
}

// liveBlock is the harness's event-derived view of one tree block.
type liveBlock struct {
	parent    scheduler.BlockKey
	hasParent bool
	tokens    []int32
	level     int
}

type harness struct {
	t        *testing.T
	data     []byte
	pos      int
	m        *kvpool.Manager
	cfg      kvpool.Config
	mem      [2][][]int32 // [tier][page][slot]
	reqs     map[uint64]*fuzzReq
	ids      []uint64 // open requests, creation order
	nextID   uint64
	nextEvID uint64
	live     map[scheduler.BlockKey]*liveBlock
}

func newHarness(t *testing.T, data []byte) *harness {
	h := &harness{t: t, data: data, reqs: map[uint64]*fuzzReq{}, live: map[scheduler.BlockKey]*liveBlock{}}
	P := 1 + int(h.next()%4)
	h.cfg = kvpool.Config{NumPages: 3 + int(h.next()%14), TokensPerPage: P, HostPages: int(h.next() % 9),
		EnableBlockReuse: h.next()%4 != 0, EventBufferMaxSize: 64, MaxSeqLen: 24 * P}
	switch b := h.next(); {
	case b%5 == 0:
		h.cfg.ReusePolicy = scheduler.PerRequest
	case b%5 == 1:
		h.cfg.ReusePolicy, h.cfg.MaxNumTurns = scheduler.PerConversation, 1+int(b/5%2)
	case b%5 == 2:
		h.cfg.DisablePartialReuse = true
	}
	h.m = newCfg(t, h.cfg)
	for tier, n := range []int{h.cfg.NumPages, h.cfg.HostPages} {
		for range n {
			h.mem[tier] = append(h.mem[tier], slices.Repeat([]int32{-1}, P))
		}
	}
	return h
}

// next consumes one input byte (0 past the end).
func (h *harness) next() byte {
	if h.pos >= len(h.data) {
		return 0
	}
	b := h.data[h.pos]
	h.pos++
	return b
}

// pick returns an open request chosen by the next byte, or nil.
func (h *harness) pick() *fuzzReq {
	if len(h.ids) == 0 {
		return nil
	}
	return h.reqs[h.ids[int(h.next())%len(h.ids)]]
}

func (h *harness) run() {
	for step := 0; h.pos < len(h.data); step++ {
		op := h.next() % 9
		h.apply(op)
		if err := h.m.CheckInvariants(); err != nil {
			h.t.Fatalf("step %d op %d: %v", step, op, err)
		}
		h.flushEvents()
		h.checkProbe()
	}
	for _, id := range slices.Clone(h.ids) {
		h.free(h.reqs[id])
	}
	h.flushEvents()
	if h.m.ReusableBlocks() != len(h.live) {
		h.t.Fatalf("events say %d live blocks, the tree holds %d", len(h.live), h.m.ReusableBlocks())
	}
	mustCheck(h.t, h.m)
}

func (h *harness) apply(op byte) {
	switch op {
	case 0, 1: // a new request's first chunk
		h.admit()
	case 2: // a continuation chunk
		if q := h.pick(); q != nil && q.r.State.IsContext() {
			h.runChunk(q)
		}
	case 3, 4: // a generation step
		if q := h.pick(); q != nil && q.r.State == scheduler.GenerationInProgress {
			h.generate(q)
		}
	case 5: // suspend
		if q := h.pick(); q != nil {
			h.m.Suspend(q.r)
		}
	case 6: // free
		if q := h.pick(); q != nil {
			h.free(q)
		}
	case 7: // grow then revert
		if q := h.pick(); q != nil && q.r.State == scheduler.GenerationInProgress && h.m.TryAllocateGeneration(q.r) {
			h.m.RevertAllocateGeneration(q.r)
		}
	case 8: // pressure: a hog allocation that evicts and migrates, then leaves
		hog := req(1<<40+h.nextID, 1, 1)
		h.nextID++
		if h.m.PrepareContext(hog) {
			h.m.ResizeContext(hog, int(h.next()%32))
			h.m.Free(hog)
		}
	}
}

// admit creates a request whose prompt shares a prefix with its family.
func (h *harness) admit() {
	id := h.nextID
	h.nextID++
	P := h.cfg.TokensPerPage
	family := int32(h.next() % 3)
	shared, own := int(h.next())%(6*P), 1+int(h.next())%(6*P)
	var tokens []int32
	for j := range shared {
		tokens = append(tokens, family*1000+int32(j))
	}
	for j := range own {
		tokens = append(tokens, 100_000+int32(id)*100+int32(j))
	}
	r := preq(id, tokens, 1+int(h.next()%6))
	if h.next()%2 == 0 {
		r.ConversationID = fmt.Sprint("conv-", family)
	}
	q := &fuzzReq{r: r}
	if !h.m.PrepareContext(r) {
		if h.m.HasCache(id) {
			h.track(q) // kept suspended; a later chunk op retries
		}
		return
	}
	q.written = r.ContextPosition // the reused prefix
	h.track(q)
	h.runChunk(q)
}

func (h *harness) track(q *fuzzReq) {
	h.reqs[q.r.ID] = q
	h.ids = append(h.ids, q.r.ID)
}

// runChunk schedules and executes one chunk of q (as scheduler+executor).
func (h *harness) runChunk(q *fuzzReq) {
	r := q.r
	if !h.m.PrepareContext(r) {
		return
	}
	if q.written < r.ContextPosition {
		q.written = r.ContextPosition
	}
	n := min(r.Remaining(), 1+int(h.next())%(3*h.cfg.TokensPerPage))
	if !h.m.ResizeContext(r, n) {
		return
	}
	h.drain()
	h.checkContent(q)
	for p := r.ContextPosition; p < r.ContextPosition+n; p++ {
		h.write(q, p, r.Tokens[p])
	}
	r.ContextPosition += n
	q.written = r.ContextPosition
	h.m.UpdateAfterContext(r)
	if r.ContextPosition == r.PromptLen {
		r.State = scheduler.GenerationInProgress
		q.gen = append(q.gen, 200_000+int32(r.ID))
		r.Generated = 1
	} else {
		r.State = scheduler.ContextInProgress
	}
}

// generate runs one decode step of q.
func (h *harness) generate(q *fuzzReq) {
	r := q.r
	if r.Generated >= r.MaxNewTokens {
		h.free(q)
		return
	}
	if !h.m.TryAllocateGeneration(r) {
		return
	}
	h.drain()
	h.checkContent(q)
	p := r.PromptLen + r.Generated - 1
	h.write(q, p, q.gen[r.Generated-1])
	q.written = p + 1
	q.gen = append(q.gen, 200_000+int32(r.ID)+int32(r.Generated)*7)
	r.Generated++
	h.m.UpdateAfterGeneration(r)
}

func (h *harness) free(q *fuzzReq) {
	h.m.Free(q.r)
	delete(h.reqs, q.r.ID)
	h.ids = slices.DeleteFunc(h.ids, func(id uint64) bool { return id == q.r.ID })
}

// drain applies the queued copies in list order, as the engine would.
func (h *harness) drain() {
	for _, c := range h.m.TakeCopies() {
		h.mem[c.DstTier][c.DstPage] = slices.Clone(h.mem[c.SrcTier][c.SrcPage])
	}
}

// write stores token at position p of q's (active) block table.
func (h *harness) write(q *fuzzReq, p int, token int32) {
	P := h.cfg.TokensPerPage
	h.mem[kvpool.TierGPU][h.m.BlockTable(q.r.ID)[p/P]][p%P] = token
}

// checkContent verifies that q's pages hold its tokens (after a drain).
func (h *harness) checkContent(q *fuzzReq) {
	P := h.cfg.TokensPerPage
	table := h.m.BlockTable(q.r.ID)
	for p := range q.written {
		if got, want := h.mem[kvpool.TierGPU][table[p/P]][p%P], q.token(p); got != want {
			h.t.Fatalf("request %d position %d: page %d holds %d, want %d", q.r.ID, p, table[p/P], got, want)
		}
	}
}

// flushEvents consumes the event stream and updates the live-block view.
func (h *harness) flushEvents() {
	for _, e := range h.m.FlushIterationEvents() {
		if e.ID != h.nextEvID {
			h.t.Fatalf("event id %d, want %d", e.ID, h.nextEvID)
		}
		h.nextEvID++
		switch e.Kind {
		case kvpool.EventStored:
			parent, has := e.Parent, e.HasParent
			for _, b := range e.Blocks {
				if h.live[b.Hash] != nil {
					h.t.Fatalf("stored twice: %x", b.Hash[:4])
				}
				h.live[b.Hash] = &liveBlock{parent: parent, hasParent: has, tokens: b.Tokens, level: b.CacheLevel}
				parent, has = b.Hash, true
			}
		case kvpool.EventRemoved:
			for _, k := range e.Hashes {
				if h.live[k] == nil {
					h.t.Fatalf("removed a block that is not live: %x", k[:4])
				}
				delete(h.live, k)
			}
		case kvpool.EventUpdated:
			if h.live[e.Hash] == nil || h.live[e.Hash].level != e.FromLevel {
				h.t.Fatalf("updated a block that is not live at level %d", e.FromLevel)
			}
			h.live[e.Hash].level = e.ToLevel
		}
	}
}

// checkProbe compares ProbeReuse with a naive match over the event-derived
// tree, for one prompt of each family.
func (h *harness) checkProbe() {
	if !h.cfg.EnableBlockReuse {
		return
	}
	P := h.cfg.TokensPerPage
	for family := range int32(3) {
		var tokens []int32
		for j := range 5*P + 2 {
			tokens = append(tokens, family*1000+int32(j))
		}
		r := preq(1<<50, tokens, 1)
		if got, want := h.m.ProbeReuse(r), h.naiveMatch(tokens[:len(tokens)-1]); got != want {
			h.t.Fatalf("family %d: ProbeReuse %d, naive match %d", family, got, want)
		}
	}
}

// naiveMatch is §6.3 on the event-derived tree: full blocks by key while
// live on the GPU, then the longest common prefix among the GPU children of
// the last matched block (none with 32 children or more).
func (h *harness) naiveMatch(lookup []int32) int {
	P := h.cfg.TokensPerPage
	parent, hasParent := kvpool.RootKey(""), false
	m := 0
	for (m + P) <= len(lookup) {
		key := kvpool.BlockKeyOf(parent, lookup[m:m+P])
		b := h.live[key]
		if b == nil || b.level != 0 || len(b.tokens) != P {
			break
		}
		parent, hasParent, m = key, true, m+P
	}
	if h.cfg.DisablePartialReuse {
		return m
	}
	var children []*liveBlock
	for _, b := range h.live {
		if b.hasParent == hasParent && (!hasParent || b.parent == parent) {
			children = append(children, b)
		}
	}
	if len(children) >= 32 {
		return m
	}
	best := 0
	rest := lookup[m:min(len(lookup), m+P)]
	for _, b := range children {
		if b.level != 0 {
			continue
		}
		q := 0
		for q < len(b.tokens) && q < len(rest) && b.tokens[q] == rest[q] {
			q++
		}
		best = max(best, q)
	}
	return m + best
}
