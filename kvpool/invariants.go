package kvpool

import "fmt"

// CheckInvariants verifies the manager's bookkeeping and returns the first
// violation found (nil if none). It is O(pages + sequences) and meant for
// tests and debug builds:
//
//   - the free list is a valid min-heap of distinct in-range indices whose
//     pages have no lock and no hold;
//   - every page's lock and hold counts equal the references of the open
//     sequences (active ones lock, suspended ones hold), so no page is
//     leaked (referenced by nobody yet not free) and, in this cut without
//     sharing, none is owned twice;
//   - free pages + owned pages = total pages;
//   - per sequence: committed ≤ history ≤ capacity ≤ pages·P,
//     pages = ceil(capacity/P), capacity within MaxSeqLen+1;
//   - Σ reservations = the reserved counter ≤ free pages.
func (m *Manager) CheckInvariants() error {
	n := m.pool.numPages()
	inFree := make([]bool, n)
	for i, p := range m.pool.free {
		if p < 0 || int(p) >= n {
			return fmt.Errorf("free list: page %d out of range [0, %d)", p, n)
		}
		if inFree[p] {
			return fmt.Errorf("free list: page %d listed twice", p)
		}
		inFree[p] = true
		if i > 0 && m.pool.free[(i-1)/2] > p {
			return fmt.Errorf("free list: heap order broken at slot %d", i)
		}
	}
	locks := make([]int32, n)
	holds := make([]int32, n)
	owned, reserved := 0, 0
	for _, id := range m.sortedIDs() {
		s := m.seqs[id]
		if err := m.checkSeq(s); err != nil {
			return err
		}
		for _, p := range s.pages {
			if p < 0 || int(p) >= n {
				return fmt.Errorf("request %d: page %d out of range [0, %d)", id, p, n)
			}
			if locks[p]+holds[p] > 0 {
				return fmt.Errorf("page %d owned twice (request %d among its owners)", p, id)
			}
			if s.status == SeqActive {
				locks[p]++
			} else {
				holds[p]++
			}
			owned++
		}
		reserved += s.reservation()
	}
	for p := range n {
		if locks[p] != m.pool.locks[p] || holds[p] != m.pool.holds[p] {
			return fmt.Errorf("page %d: counts locks %d holds %d, sequences say %d and %d",
				p, m.pool.locks[p], m.pool.holds[p], locks[p], holds[p])
		}
		if inFree[p] && locks[p]+holds[p] > 0 {
			return fmt.Errorf("page %d is free and owned", p)
		}
		if !inFree[p] && locks[p]+holds[p] == 0 {
			return fmt.Errorf("page %d leaked: neither free nor owned", p)
		}
	}
	if free := m.pool.numFree(); free+owned != n {
		return fmt.Errorf("free %d + owned %d != total %d", free, owned, n)
	}
	if reserved != m.reserved {
		return fmt.Errorf("reserved counter %d != Σ reservations %d", m.reserved, reserved)
	}
	if m.reserved > m.pool.numFree() {
		return fmt.Errorf("reserved %d > free %d: a reservation cannot be honoured", m.reserved, m.pool.numFree())
	}
	return nil
}

// checkSeq verifies one sequence's lengths and status.
func (m *Manager) checkSeq(s *sequence) error {
	P := m.cfg.TokensPerPage
	switch {
	case s.status != SeqActive && s.status != SeqSuspended:
		return fmt.Errorf("request %d: open sequence with status %s", s.id, s.status)
	case s.committed < 0 || s.committed > s.history:
		return fmt.Errorf("request %d: committed %d not in [0, history %d]", s.id, s.committed, s.history)
	case s.history > s.capacity:
		return fmt.Errorf("request %d: history %d > capacity %d", s.id, s.history, s.capacity)
	case s.capacity > len(s.pages)*P:
		return fmt.Errorf("request %d: capacity %d > %d pages × %d", s.id, s.capacity, len(s.pages), P)
	case len(s.pages) != ceilDiv(s.capacity, P):
		return fmt.Errorf("request %d: %d pages for capacity %d (want %d)", s.id, len(s.pages), s.capacity, ceilDiv(s.capacity, P))
	case m.maxCapacity > 0 && s.capacity > m.maxCapacity:
		return fmt.Errorf("request %d: capacity %d > MaxSeqLen+1 = %d", s.id, s.capacity, m.maxCapacity)
	}
	return nil
}
