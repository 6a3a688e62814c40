package kvpool

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Manager is one rank's KV cache manager. It implements scheduler.KVManager
// and the executor-facing operations of kvcache.md §8.
//
// Contract: every operation that can fail either succeeds or leaves the
// manager unchanged. Programming errors (resizing a suspended cache,
// decreasing history, shrinking below history) panic with the broken
// invariant's name, as STYLE.md asks. Not safe for concurrent use.
type Manager struct {
	cfg  Config
	pool pagePool
	// seqs holds every open (active or suspended) sequence. It is only ever
	// looked up by id; no decision iterates it in map order.
	seqs map[uint64]*sequence
	// spare holds closed sequences for reuse, so that steady-state traffic
	// allocates no new block-table arrays.
	spare []*sequence
	// reserved is Σ reservation() over open sequences. Invariant:
	// reserved ≤ pool.numFree(), which is what guarantees that a request
	// admitted under GUARANTEED_NO_EVICT never waits for pages.
	reserved int
	// maxCapacity caps a sequence's capacity in tokens; 0 = unlimited.
	maxCapacity int
	closed      bool
}

var _ scheduler.KVManager = (*Manager)(nil)

// New builds a manager with every page free.
func New(cfg Config) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:  cfg,
		pool: newPagePool(cfg.NumPages),
		seqs: make(map[uint64]*sequence),
	}
	if cfg.MaxSeqLen > 0 {
		m.maxCapacity = cfg.MaxSeqLen + 1
	}
	return m, nil
}

// Close closes every open sequence (in id order) and retires the manager:
// afterwards no cache can be created, and every page is free. Idempotent.
func (m *Manager) Close() {
	for _, id := range m.sortedIDs() {
		m.closeSeq(m.seqs[id])
	}
	m.closed = true
}

// TotalPages is the device pool size.
func (m *Manager) TotalPages() int { return m.pool.numPages() }

// FreePages is the number of free device pages (reserved ones included).
func (m *Manager) FreePages() int { return m.pool.numFree() }

// ReservedPages is Σ over open sequences of their unallocated
// GUARANTEED_NO_EVICT reservation.
func (m *Manager) ReservedPages() int { return m.reserved }

// TokensPerPage is P.
func (m *Manager) TokensPerPage() int { return m.cfg.TokensPerPage }

// MaxBlocksPerSeq is the page-table row width (kvcache.md §4.3):
// ceil((MaxSeqLen+1)/P) rounded up to a multiple of 4; 0 when MaxSeqLen is
// unlimited.
func (m *Manager) MaxBlocksPerSeq() int { return m.cfg.maxBlocksPerSeq() }

// NumSequences is the number of open sequences.
func (m *Manager) NumSequences() int { return len(m.seqs) }

// Sequence returns a snapshot of id's sequence, if it is open.
func (m *Manager) Sequence(id uint64) (SequenceInfo, bool) {
	s, ok := m.seqs[id]
	if !ok {
		return SequenceInfo{}, false
	}
	return s.info(), true
}

// create opens a fresh SUSPENDED sequence with all lengths 0 (no reuse
// match in this cut). The caller checked that id has no sequence.
func (m *Manager) create(id uint64) *sequence {
	var s *sequence
	if n := len(m.spare); n > 0 {
		s = m.spare[n-1]
		m.spare[n-1] = nil
		m.spare = m.spare[:n-1]
	} else {
		s = new(sequence)
	}
	s.reset(id)
	m.seqs[id] = s
	return s
}

// resume makes a suspended sequence ACTIVE: holds become locks. Without a
// host tier nothing has to come back, so resume cannot fail (kvcache.md §5.2:
// the utilisation gate applies only when pages are on the host).
func (m *Manager) resume(s *sequence) {
	if s.status != SeqSuspended {
		return
	}
	for _, p := range s.pages {
		m.pool.holdToLock(p)
	}
	s.status = SeqActive
}

// suspend makes an active sequence SUSPENDED: locks become holds; nothing
// moves (a host tier would migrate pages only under pressure, §4.2).
func (m *Manager) suspend(s *sequence) {
	if s.status != SeqActive {
		return
	}
	for _, p := range s.pages {
		m.pool.lockToHold(p)
	}
	s.status = SeqSuspended
}

// closeSeq releases every page and the reservation of s and forgets it.
func (m *Manager) closeSeq(s *sequence) {
	m.reserved -= s.reservation()
	for _, p := range s.pages {
		if s.status == SeqActive {
			m.pool.unlock(p)
		} else {
			m.pool.unhold(p)
		}
	}
	delete(m.seqs, s.id)
	s.status = SeqClosed
	s.pages = s.pages[:0]
	s.reserveTarget = 0
	m.spare = append(m.spare, s)
}

// resize sets the capacity of an ACTIVE sequence (kvcache.md §5.3). Growth
// allocates the missing pages all-or-nothing and returns false, changing
// nothing, when they are not available; shrink releases tail pages.
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
	delta := ceilDiv(capacity, m.cfg.TokensPerPage) - len(s.pages)
	if delta > 0 && !m.canGrow(s, delta) {
		return false
	}
	m.reserved -= s.reservation()
	for ; delta > 0; delta-- {
		s.pages = append(s.pages, m.pool.take())
	}
	for ; delta < 0; delta++ {
		last := len(s.pages) - 1
		m.pool.unlock(s.pages[last])
		s.pages = s.pages[:last]
	}
	m.reserved += s.reservation()
	s.capacity = capacity
	return true
}

// canGrow reports whether s may take delta more pages without eating into
// another sequence's reservation: after the allocation, the free pages must
// still cover every reservation, s's own reservation shrinking as its pages
// arrive ("later growth draws from the reservation").
func (m *Manager) canGrow(s *sequence, delta int) bool {
	before := s.reservation()
	after := max(0, s.reserveTarget-len(s.pages)-delta)
	return m.pool.numFree()-delta >= m.reserved-before+after
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
