package kvpool_test

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/transcript"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// rewrite regenerates the expected output of the transcripts in testdata/:
//
//	go test ./kvpool/ -run TestTranscripts -rewrite
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of kvpool/testdata/*.txt")

// TestTranscripts plays the stories of testdata/*.txt against one Manager
// each (format: internal/transcript). The invariants are checked after every
// command. Commands, as the scheduler and the executor would call the pool:
//
//	config pages=N page=P [host=N] [reuse=on] [partial=on] [events=N]
//	       [policy=all_reusable|per_request|per_conversation] [turns=N]
//	       [max_seq_len=N] [rows=N] [reserved=N] [util=F]
//	                          a new manager (forgets every request)
//	request id=N tokens=1..8,9 [max_new=N] [conv=C]
//	                          declares a request (its prompt is tokens)
//	prepare id=N              PrepareContext (first chunk: create, match, claim)
//	resize id=N n=N           ResizeContext for an n-token chunk
//	ran id=N [n=N]            the chunk ran: position += n (default: the rest
//	                          of the prompt), UpdateAfterContext; the last
//	                          chunk samples the first token
//	chunk id=N [n=N]          prepare, resize and ran in one
//	grow id=N                 TryAllocateGeneration
//	revert id=N               RevertAllocateGeneration
//	gen id=N [n=N]            n generation steps: grow, append a token,
//	                          UpdateAfterGeneration (stops at a failed grow)
//	suspend id=N | free id=N | release id=N   Suspend | Free | ReleaseContextAdmission
//	dummy id=N tokens=N       AddDummy
//	probe id=N                ProbeReuse and ProbeFirstNewBlockKey
//	clear                     ClearReusableBlocks
//	copies                    TakeCopies (the page copies decided since the last take)
//	events                    FlushIterationEvents
//	dump [flush=off]          the pool: free pages, sequences, radix tree,
//	                          eviction order, prefix counters; then, like the
//	                          end of an iteration, takes the copies and flushes
//	                          the events (unless flush=off)
//
// A sequence prints as "seq ID STATUS row R cap C hist H committed K
// pos P/L gen G pages ...", each page "g3" (GPU page 3) or "h0" (host page 0),
// followed by "@key" when it is a radix block's page ("(detached)" once the
// block left the tree). Keys print as "#" and their first 6 hex digits.
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, "testdata/*.txt", *rewrite, func(t *testing.T) func(*transcript.Command) string {
		s := &poolStory{t: t}
		return s.do
	})
}

// poolStory is the state of one transcript: the manager and the requests
// declared so far.
type poolStory struct {
	t    *testing.T
	m    *kvpool.Manager
	reqs map[uint64]*scheduler.Request
}

func (s *poolStory) do(c *transcript.Command) string {
	if c.Name != "config" && s.m == nil {
		c.Fatalf("config first")
	}
	out := s.command(c)
	if s.m != nil {
		if err := s.m.CheckInvariants(); err != nil {
			s.t.Errorf("%s: %s: invariants: %v", c.Pos, c.Line, err)
		}
	}
	return out
}

func (s *poolStory) command(c *transcript.Command) string {
	switch c.Name {
	case "config":
		return s.config(c)
	case "request":
		return s.request(c)
	case "prepare":
		r := s.req(c)
		ok := s.m.PrepareContext(r)
		return fmt.Sprintf("%v\n%s", ok, s.seq(r.ID))
	case "resize":
		r := s.req(c)
		ok := s.m.ResizeContext(r, c.Int("n", r.Remaining()))
		return fmt.Sprintf("%v\n%s", ok, s.seq(r.ID))
	case "ran":
		r := s.req(c)
		s.ran(r, c.Int("n", r.Remaining()))
		return s.seq(r.ID)
	case "chunk":
		return s.chunk(c)
	case "grow":
		r := s.req(c)
		ok := s.m.TryAllocateGeneration(r)
		return fmt.Sprintf("%v\n%s", ok, s.seq(r.ID))
	case "revert":
		r := s.req(c)
		s.m.RevertAllocateGeneration(r)
		return s.seq(r.ID)
	case "gen":
		return s.gen(c)
	case "suspend":
		r := s.req(c)
		s.m.Suspend(r)
		return s.seq(r.ID)
	case "free":
		r := s.req(c)
		s.m.Free(r)
		return s.seq(r.ID)
	case "release":
		r := s.req(c)
		s.m.ReleaseContextAdmission(r)
		return s.seq(r.ID)
	case "dummy":
		id := uint64(c.Int("id", 0))
		r := &scheduler.Request{ID: id, IsDummy: true, State: scheduler.GenerationInProgress, PromptLen: 1}
		s.reqs[id] = r
		ok := s.m.AddDummy(r, c.Int("tokens", 1))
		return fmt.Sprintf("%v\n%s", ok, s.seq(id))
	case "probe":
		r := s.req(c)
		key, ok := s.m.ProbeFirstNewBlockKey(r)
		first := "none"
		if ok {
			first = short(key)
		}
		return fmt.Sprintf("reuse %d first new block %s", s.m.ProbeReuse(r), first)
	case "clear":
		s.m.ClearReusableBlocks()
		return fmt.Sprintf("%d blocks left", s.m.ReusableBlocks())
	case "copies":
		return orNone(copiesOf(s.m.TakeCopies()))
	case "events":
		return orNone(eventLines(s.m.FlushIterationEvents()))
	case "dump":
		return s.dump(c.Bool("flush", true))
	}
	c.Fatalf("unknown command %q", c.Name)
	return ""
}

func (s *poolStory) config(c *transcript.Command) string {
	cfg := kvpool.Config{
		NumPages: c.Int("pages", 8), TokensPerPage: c.Int("page", 4), HostPages: c.Int("host", 0),
		EnableBlockReuse: c.Bool("reuse", true), DisablePartialReuse: !c.Bool("partial", true),
		EventBufferMaxSize: c.Int("events", 100), MaxNumTurns: c.Int("turns", 0),
		MaxSeqLen: c.Int("max_seq_len", 0), PageTableRows: c.Int("rows", 0), ReservedIndexSlots: c.Int("reserved", 0),
	}
	if c.Has("util") {
		if _, err := fmt.Sscanf(c.Str("util", ""), "%g", &cfg.MaxUtilForResume); err != nil {
			c.Fatalf("util: %v", err)
		}
	}
	switch p := c.Str("policy", "all_reusable"); p {
	case "all_reusable":
		cfg.ReusePolicy = scheduler.AllReusable
	case "per_request":
		cfg.ReusePolicy = scheduler.PerRequest
	case "per_conversation":
		cfg.ReusePolicy = scheduler.PerConversation
	default:
		c.Fatalf("policy %q: want all_reusable, per_request or per_conversation", p)
	}
	m, err := kvpool.New(cfg)
	if err != nil {
		s.m = nil
		return "error: " + err.Error()
	}
	s.m, s.reqs = m, map[uint64]*scheduler.Request{}
	return m.String()
}

func (s *poolStory) request(c *transcript.Command) string {
	id := uint64(c.Int("id", 0))
	if _, dup := s.reqs[id]; dup {
		c.Fatalf("request %d declared twice", id)
	}
	var tokens []int32
	for _, x := range c.Ints("tokens") {
		tokens = append(tokens, int32(x))
	}
	if len(tokens) == 0 {
		c.Fatalf("a request needs tokens")
	}
	s.reqs[id] = &scheduler.Request{ID: id, State: scheduler.ContextInit, Tokens: tokens, PromptLen: len(tokens),
		MaxNewTokens: c.Int("max_new", 8), ConversationID: c.Str("conv", ""),
		BatchIndex: scheduler.NoBatchIndex, UncachedEstimate: scheduler.UnsetEstimate}
	return ""
}

// req is the request named by id=.
func (s *poolStory) req(c *transcript.Command) *scheduler.Request {
	id := uint64(c.Int("id", 0))
	r, ok := s.reqs[id]
	if !ok {
		c.Fatalf("no request %d (declare it with request)", id)
	}
	return r
}

// ran records that r's chunk of n tokens executed, as the executor does:
// advance the position, then UpdateAfterContext; the prompt's last chunk
// samples the first token.
func (s *poolStory) ran(r *scheduler.Request, n int) {
	r.ContextPosition += n
	s.m.UpdateAfterContext(r)
	if r.ContextPosition == r.PromptLen {
		r.State = scheduler.GenerationInProgress
		r.Generated = 1
	} else {
		r.State = scheduler.ContextInProgress
	}
}

// chunk is one context chunk as scheduled and executed: PrepareContext,
// ResizeContext, ran. It stops at the first failing call.
func (s *poolStory) chunk(c *transcript.Command) string {
	r := s.req(c)
	if !s.m.PrepareContext(r) {
		return "prepare false\n" + s.seq(r.ID)
	}
	n := c.Int("n", r.Remaining())
	if !s.m.ResizeContext(r, n) {
		return "resize false\n" + s.seq(r.ID)
	}
	from := r.ContextPosition
	s.ran(r, n)
	return fmt.Sprintf("ran %d..%d\n%s", from, r.ContextPosition, s.seq(r.ID))
}

// gen runs n generation steps of r: grow, the step appends a token,
// UpdateAfterGeneration.
func (s *poolStory) gen(c *transcript.Command) string {
	r := s.req(c)
	n := c.Int("n", 1)
	for i := 0; i < n; i++ {
		if !s.m.TryAllocateGeneration(r) {
			return fmt.Sprintf("step %d of %d: grow false\n%s", i+1, n, s.seq(r.ID))
		}
		r.Generated++
		s.m.UpdateAfterGeneration(r)
	}
	return s.seq(r.ID)
}

// seq prints id's sequence, or says it has none.
func (s *poolStory) seq(id uint64) string {
	info, ok := s.m.Sequence(id)
	if !ok {
		return fmt.Sprintf("seq %d: no cache", id)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seq %d %s row %d cap %d hist %d committed %d", id, info.Status, info.Row,
		info.Capacity, info.History, info.Committed)
	if r := s.reqs[id]; r != nil && !r.IsDummy {
		fmt.Fprintf(&b, " pos %d/%d gen %d", r.ContextPosition, r.PromptLen, r.Generated)
	}
	if info.ReusedTokens > 0 {
		fmt.Fprintf(&b, " reused %d", info.ReusedTokens)
	}
	if info.Dummy {
		b.WriteString(" dummy")
	}
	if info.GrowthRecorded {
		b.WriteString(" growth")
	}
	if info.ReservedPages > 0 {
		fmt.Fprintf(&b, " reserved %d", info.ReservedPages)
	}
	b.WriteString(" pages")
	for _, p := range s.m.SnapPages(id) {
		b.WriteString(" " + pageName(p.Tier, p.Page))
		if p.Block {
			b.WriteString("@" + short(p.Key))
		}
		if p.Detached {
			b.WriteString("(detached)")
		}
	}
	return b.String()
}

// dump prints the whole pool, then (flush) takes the copies and events.
func (s *poolStory) dump(flush bool) string {
	m := s.m
	var b strings.Builder
	fmt.Fprintf(&b, "gpu %d pages: free %v cached %d util %.3f available %d tokens\n", m.TotalPages(),
		m.SnapFree(kvpool.TierGPU), m.CachedPages(), m.Utilization(), m.AvailableTokens())
	if m.HasHostTier() {
		fmt.Fprintf(&b, "host %d pages: free %v\n", m.HostPages(), m.SnapFree(kvpool.TierHost))
	}
	for _, id := range m.SnapSequenceIDs() {
		b.WriteString(s.seq(id) + "\n")
	}
	tree := m.SnapTree()
	if len(tree) == 0 {
		b.WriteString("tree: empty\n")
	} else {
		b.WriteString("tree:\n")
	}
	for _, n := range tree {
		fmt.Fprintf(&b, "%s%s %v %s locks %d holds %d", strings.Repeat("  ", n.Depth+1), short(n.Key), n.Tokens,
			pageName(n.Tier, n.Page), n.Locks, n.Holds)
		if n.Cached {
			b.WriteString(" cached")
		}
		if n.Salt != "" {
			b.WriteString(" salt " + n.Salt)
		}
		b.WriteString("\n")
	}
	if order := m.SnapEvictionOrder(); len(order) > 0 {
		b.WriteString("eviction order:")
		for _, k := range order {
			b.WriteString(" " + short(k))
		}
		b.WriteString("\n")
	}
	if ps := m.PrefixStats(); ps.Admissions > 0 {
		fmt.Fprintf(&b, "prefix: admissions %d prompt tokens %d reused %d\n", ps.Admissions, ps.PromptTokens, ps.ReusedTokens)
	}
	if notes := m.TakeNotes(); len(notes) > 0 {
		for _, n := range notes {
			b.WriteString("note: " + n + "\n")
		}
	}
	if flush {
		if c := copiesOf(m.TakeCopies()); c != "" {
			b.WriteString("copies: " + c + "\n")
		}
		for _, l := range strings.Split(eventLines(m.FlushIterationEvents()), "\n") {
			if l != "" {
				b.WriteString("event " + l + "\n")
			}
		}
	}
	return b.String()
}

// pageName is "g3" for GPU page 3, "h0" for host page 0.
func pageName(t kvpool.Tier, page int32) string {
	if t == kvpool.TierHost {
		return fmt.Sprintf("h%d", page)
	}
	return fmt.Sprintf("g%d", page)
}

// short names a block key by its first 6 hex digits.
func short(k scheduler.BlockKey) string { return "#" + kvpool.KeyHex(k)[:6] }

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// copiesOf prints copies in order: "g3→h0 h0→g2".
func copiesOf(cs []kvpool.PageCopy) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, pageName(c.SrcTier, c.SrcPage)+"→"+pageName(c.DstTier, c.DstPage))
	}
	return strings.Join(parts, " ")
}

// eventLines prints one event per line: "ID KIND fields".
func eventLines(evs []kvpool.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%d %s", e.ID, e.Kind)
		switch e.Kind {
		case kvpool.EventCreated:
			fmt.Fprintf(&b, " blocks per level %v", e.BlocksPerLevel)
		case kvpool.EventStored:
			parent := "root"
			if e.HasParent {
				parent = short(e.Parent)
			}
			fmt.Fprintf(&b, " under %s:", parent)
			for _, blk := range e.Blocks {
				fmt.Fprintf(&b, " %s%v", short(blk.Hash), blk.Tokens)
				if blk.CacheLevel != 0 {
					fmt.Fprintf(&b, " level %d", blk.CacheLevel)
				}
			}
		case kvpool.EventRemoved:
			for _, h := range e.Hashes {
				b.WriteString(" " + short(h))
			}
		case kvpool.EventUpdated:
			fmt.Fprintf(&b, " %s level %d→%d", short(e.Hash), e.FromLevel, e.ToLevel)
		}
		b.WriteString("\n")
	}
	return b.String()
}
