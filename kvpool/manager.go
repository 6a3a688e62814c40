package kvpool

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Manager is one rank's KV cache manager. It implements scheduler.KVManager
// and the executor-facing operations of kvcache.md §8.
//
// Contract: every operation that can fail either succeeds or leaves the
// manager unchanged (apart from the advisory LRU clock). Programming errors
// (resizing a suspended cache, decreasing history, shrinking below history)
// panic with the broken invariant's name, as STYLE.md asks. Not safe for
// concurrent use: the rank's scheduling goroutine owns it.
//
// Side effects the native layer must perform are handed back as data: page
// copies (TakeCopies) and KV cache events (FlushIterationEvents).
type Manager struct {
	cfg Config
	lb  int // ledger block in tokens (P, or P·cp under Helix)

	gpu, host tierPool
	// heldGPU counts GPU pages with holds but no lock: migratable to the
	// host tier (§4.2 step 4).
	heldGPU int

	// seqs holds every open (active or suspended) sequence. It is only ever
	// looked up by id; no decision iterates it in map order.
	seqs map[uint64]*sequence
	// seqCache holds open sequences only (seq; closeSeq clears a slot).
	seqCache [seqCacheSize]*sequence
	// spare holds closed sequences for reuse, so that steady-state traffic
	// allocates no new block tables.
	spare []*sequence
	// reserved is Σ reservation() over open sequences (GUARANTEED_NO_EVICT).
	reserved int
	// maxCapacity caps a sequence's capacity in tokens; 0 = unlimited.
	maxCapacity int
	maxUtil     float64
	closed      bool
	// fullScratch holds the full blocks of the last match (match,
	// fullBlocks), reused so that a match allocates nothing once grown.
	fullScratch []*node
	// stampScratch holds a closing sequence's claim stamps
	// (ReleaseContextAdmission).
	stampScratch []claimStamp
	// tick is the manager-wide logical clock: LRU use stamps and suspension
	// order. It never decides anything by itself; it only orders.
	tick uint64

	// Radix tree (§6): every in-tree node (roots included) by key, the
	// cached leaves in eviction order, and the number of cached nodes.
	// nodes is indexed by the lookup key's first 64 bits (nodeIndex):
	// half the map's memory traffic of the whole key. An entry whose full
	// key, parent or tokens differ from the ones looked for is a
	// collision, handled as one of the whole key always was.
	nodes     map[uint64]*node
	roots     map[string]*node // by cache salt
	leaves    leafHeap
	numCached int
	hasher    keyHasher
	convs     map[string]*conversation

	// Page-table rows (§4.3).
	rows rowTable

	// copies are the page copies decided since the last TakeCopies.
	copies, copiesSpare []PageCopy

	ev    eventBuffer
	notes []string
	stats PrefixStats
}

var _ scheduler.KVManager = (*Manager)(nil)

// New builds a manager with every page free. With events enabled the
// created event (id 0) is pending.
func New(cfg Config) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:     cfg,
		lb:      cfg.ledgerBlock(),
		gpu:     newTierPool(cfg.NumPages),
		host:    newTierPool(cfg.HostPages),
		seqs:    make(map[uint64]*sequence),
		nodes:   make(map[uint64]*node),
		roots:   make(map[string]*node),
		convs:   make(map[string]*conversation),
		maxUtil: cfg.MaxUtilForResume,
		rows:    newRowTable(cfg.PageTableRows, cfg.ReservedIndexSlots),
	}
	if m.maxUtil == 0 {
		m.maxUtil = defaultMaxUtilForResume
	}
	if cfg.MaxSeqLen > 0 {
		m.maxCapacity = cfg.MaxSeqLen + 1
	}
	m.ev.init(cfg)
	return m, nil
}

// Close closes every open sequence (in id order) and retires the manager:
// afterwards no cache can be created. Cached radix blocks stay (they free on
// demand); ClearReusableBlocks drops them. Idempotent.
func (m *Manager) Close() {
	for _, id := range m.sortedIDs() {
		m.closeSeq(m.seqs[id])
	}
	m.closed = true
}

// TotalPages is the device pool size.
func (m *Manager) TotalPages() int { return m.gpu.numPages() }

// FreePages is the number of free device pages (reserved ones included,
// cached ones excluded).
func (m *Manager) FreePages() int { return m.gpu.numFree() }

// CachedPages is the number of cached device pages: committed blocks no
// sequence references, evictable on demand.
func (m *Manager) CachedPages() int { return m.numCached }

// HostPages is the host tier's size (0 = no host tier).
func (m *Manager) HostPages() int { return m.host.numPages() }

// FreeHostPages is the number of free host pages.
func (m *Manager) FreeHostPages() int { return m.host.numFree() }

// ReservedPages is Σ over open sequences of their unallocated
// GUARANTEED_NO_EVICT reservation.
func (m *Manager) ReservedPages() int { return m.reserved }

// TokensPerPage is P.
func (m *Manager) TokensPerPage() int { return m.cfg.TokensPerPage }

// LedgerBlockTokens is the bookkeeping unit in tokens: P, or P·cp under
// Helix (§10.1). One ledger block is one page on this rank.
func (m *Manager) LedgerBlockTokens() int { return m.lb }

// MaxBlocksPerSeq is the page-table row width (kvcache.md §4.3):
// ceil((MaxSeqLen+1)/ledger block) rounded up to a multiple of 4; 0 when
// MaxSeqLen is unlimited.
func (m *Manager) MaxBlocksPerSeq() int { return m.cfg.maxBlocksPerSeq() }

// Utilization is 1 − (free + cached GPU pages) / GPU pages (§5.2).
func (m *Manager) Utilization() float64 {
	return 1 - float64(m.gpu.numFree()+m.numCached)/float64(m.gpu.numPages())
}

// NumSequences is the number of open sequences.
func (m *Manager) NumSequences() int { return len(m.seqs) }

// Sequence returns a snapshot of id's sequence, if it is open.
func (m *Manager) Sequence(id uint64) (SequenceInfo, bool) {
	s, ok := m.seq(id)
	if !ok {
		return SequenceInfo{}, false
	}
	return s.info(), true
}

// create opens a fresh SUSPENDED sequence with all lengths 0 in a free
// page-table row, or returns nil when no row is free. The caller checked
// that id has no sequence.
func (m *Manager) create(id uint64, dummy bool) *sequence {
	row := m.rows.take(dummy)
	if row < 0 {
		return nil
	}
	var s *sequence
	if n := len(m.spare); n > 0 {
		s = m.spare[n-1]
		m.spare[n-1] = nil
		m.spare = m.spare[:n-1]
	} else {
		s = new(sequence)
	}
	s.reset(id)
	s.row = row
	s.dummy = dummy
	s.stopped = !m.cfg.EnableBlockReuse // reuse off: committing stops at creation
	m.tick++
	s.suspendedAt = m.tick
	m.seqs[id] = s
	m.seqCache[id%seqCacheSize] = s
	return s
}

// seqCacheSize is the number of slots of Manager.seqCache.
const seqCacheSize = 512

// seq returns id's open sequence. A direct-mapped cache of the last
// sequence seen in each slot (by id) answers most lookups with one load and
// one compare; the map answers the rest (issue 24: the map's probes were the
// control plane's largest cost per decoded request at batch 256, every
// lookup a cache miss after the engine's step).
func (m *Manager) seq(id uint64) (*sequence, bool) {
	slot := &m.seqCache[id%seqCacheSize]
	if s := *slot; s != nil && s.id == id {
		return s, true
	}
	s, ok := m.seqs[id]
	if ok {
		*slot = s
	}
	return s, ok
}

// suspend makes an active sequence SUSPENDED: locks become holds; nothing
// moves now (migration happens only under GPU pressure, §4.2).
func (m *Manager) suspend(s *sequence) {
	if s.status != SeqActive {
		return
	}
	for _, b := range s.blocks {
		m.lockToHold(b.where())
	}
	s.status = SeqSuspended
	m.tick++
	s.suspendedAt = m.tick
}

// closeSeq releases every page, the reservation and the row of s, records
// its drop plan (§7) and forgets it. Blocks are released tail first, so a
// block is unreferenced only after every block below it in the tree.
func (m *Manager) closeSeq(s *sequence) {
	m.reserved -= s.reservation()
	active := s.status == SeqActive
	for k := len(s.blocks) - 1; k >= 0; k-- {
		m.release(s.blocks[k], active)
	}
	// The sequence goes to m.spare with its arrays: its old blocks must
	// not keep evicted radix nodes (and their ancestors) alive.
	clear(s.blocks)
	s.blocks = s.blocks[:0]
	s.table = s.table[:0]
	m.rows.release(s.row, s.dummy)
	delete(m.seqs, s.id)
	if slot := &m.seqCache[s.id%seqCacheSize]; *slot == s {
		*slot = nil
	}
	s.status = SeqClosed
	s.reserveTarget = 0
	m.endConversationTurn(s)
	clear(s.inserted)
	s.inserted = s.inserted[:0]
	clear(s.claimStamps)
	s.claimStamps = s.claimStamps[:0]
	s.root = nil
	m.spare = append(m.spare, s)
}

// hintBlocks sets s.blockHint from r's prompt and generation limit, at
// most the pool's pages (so a huge limit reserves no huge arrays).
func (m *Manager) hintBlocks(s *sequence, r *scheduler.Request) {
	limit := m.cfg.NumPages * m.lb
	tokens := min(max(0, r.PromptLen), limit) + min(max(0, r.MaxNewTokens), limit)
	s.blockHint = min(ceilDiv(tokens, m.lb), m.cfg.NumPages)
}

// resize sets the capacity of an ACTIVE sequence (kvcache.md §5.3). Growth
// allocates the missing pages all-or-nothing (§4.2) and returns false,
// changing nothing, when they cannot be had without eating into another
// sequence's reservation; shrink releases tail pages.

func (m *Manager) resize(s *sequence, capacity int) bool {
	if s.status != SeqActive {
		panic(fmt.Sprintf("kvpool: invariant resize-requires-active: request %d is %s", s.id, s.status))
	}
	if capacity < s.history {
		panic(fmt.Sprintf("kvpool: invariant capacity-above-history: request %d capacity %d < history %d",
			s.id, capacity, s.history))
	}
	if m.maxCapacity > 0 && capacity > m.maxCapacity {
		return false
	}
	delta := ceilDiv(capacity, m.lb) - len(s.blocks)
	if delta > 0 {
		after := m.reserved - s.reservation() + max(0, s.reserveTarget-len(s.blocks)-delta)
		if !m.canObtain(delta, after) {
			return false
		}
		m.makeFree(delta)
	}
	m.reserved -= s.reservation()
	if need := len(s.blocks) + delta; need > cap(s.blocks) || need > cap(s.table) {
		s.grow(max(need, s.blockHint))
	}
	for ; delta > 0; delta-- {
		pg := m.gpu.take()
		m.gpu.locks[pg] = 1 // a free page has no reference, owner or hold
		s.blocks = append(s.blocks, blockRef{loc: pageLoc{TierGPU, pg}})
		s.table = append(s.table, pg)
	}
	for ; delta < 0; delta++ {
		last := len(s.blocks) - 1
		m.release(s.blocks[last], true)
		s.blocks[last] = blockRef{}
		s.blocks = s.blocks[:last]
		s.table = s.table[:last]
	}
	m.reserved += s.reservation()
	s.capacity = capacity
	return true
}

// setHistory advances history to h (kvcache.md §5.1). History never
// decreases; a value beyond capacity is a programming error.
func (m *Manager) setHistory(s *sequence, h int) {
	if h > s.capacity {
		panic(fmt.Sprintf("kvpool: invariant history-within-capacity: request %d history %d > capacity %d",
			s.id, h, s.capacity))
	}
	if h > s.history {
		s.history = h
	}
}

// rebuildTable rewrites the row content from the blocks (resume).
func (s *sequence) rebuildTable() {
	s.table = s.table[:0]
	for _, b := range s.blocks {
		s.table = append(s.table, b.where().page)
	}
}

// sortedIDs lists the open sequences' ids in increasing order, for the
// operations that must visit all of them deterministically.
func (m *Manager) sortedIDs() []uint64 {
	ids := make([]uint64, 0, len(m.seqs))
	for id := range m.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// String summarises the pool for logs.
func (m *Manager) String() string {
	return fmt.Sprintf("kvpool{pages %d, free %d, cached %d, reserved %d, host %d/%d free, sequences %d, P %d}",
		m.gpu.numPages(), m.gpu.numFree(), m.numCached, m.reserved, m.host.numFree(), m.host.numPages(),
		len(m.seqs), m.cfg.TokensPerPage)
}

// TakeNotes returns and clears the warnings the manager wants logged (e.g.
// the PER_CONVERSATION "already has current request" warning of §7). The
// manager does no logging itself.
func (m *Manager) TakeNotes() []string {
	n := m.notes
	m.notes = nil
	return n
}

// rowTable hands out page-table rows (§4.3), lowest index first.
// Ordinary sequences may hold at most limit − reserved rows; dummies may
// take any row. limit 0 = unlimited (the table grows).
type rowTable struct {
	used            []bool
	limit, reserved int
	ordinary        int // rows held by non-dummy sequences
}

func newRowTable(limit, reserved int) rowTable {
	return rowTable{used: make([]bool, limit), limit: limit, reserved: reserved}
}

// take returns the lowest free row, or −1.
func (t *rowTable) take(dummy bool) int {
	if t.limit > 0 && !dummy && t.ordinary >= t.limit-t.reserved {
		return -1
	}
	i := slices.Index(t.used, false)
	if i < 0 {
		if t.limit > 0 {
			return -1
		}
		i = len(t.used)
		t.used = append(t.used, false)
	}
	t.used[i] = true
	if !dummy {
		t.ordinary++
	}
	return i
}

// release frees row i of a sequence (dummy says which kind held it).
func (t *rowTable) release(i int, dummy bool) {
	if i >= 0 && i < len(t.used) && t.used[i] {
		t.used[i] = false
		if !dummy {
			t.ordinary--
		}
	}
}
