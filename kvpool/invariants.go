package kvpool

import (
	"fmt"
	"slices"
)

// CheckInvariants verifies the manager's bookkeeping and returns the first
// violation found (nil if none). It is O(pages + blocks + nodes) and meant
// for tests and debug builds:
//
//   - each free list is a valid min-heap of distinct in-range indices whose
//     pages have no reference and no owner;
//   - every page's lock and hold counts equal the references of the open
//     sequences (active ones lock, suspended ones hold): no page leaked,
//     none double-owned (a private page has exactly one reference);
//   - every page is exactly one of free, referenced, or cached (an in-tree
//     GPU block nobody references); free + referenced + cached = total;
//   - the radix tree: map ⇔ in-tree nodes, parent/children links, page
//     owners, the cached count, the leaf heap (exactly the cached leaves, in
//     heap order), no unreferenced block on the host, events tracked ⇔ in
//     tree (when events and reuse are on);
//   - per sequence: committed ≤ history ≤ capacity ≤ blocks·B, blocks =
//     ceil(capacity/B), capacity within MaxSeqLen+1, an ACTIVE sequence's
//     pages all on the GPU and its row equal to them, distinct rows;
//   - Σ reservations = the reserved counter ≤ obtainable pages; heldGPU.
func (m *Manager) CheckInvariants() error {
	if err := m.checkFreeList(&m.gpu, TierGPU); err != nil {
		return err
	}
	if err := m.checkFreeList(&m.host, TierHost); err != nil {
		return err
	}
	refs := [2][][2]int32{make([][2]int32, m.gpu.numPages()), make([][2]int32, m.host.numPages())}
	private := [2][]int{make([]int, m.gpu.numPages()), make([]int, m.host.numPages())}
	reserved := 0
	rows := map[int]uint64{}
	for _, id := range m.sortedIDs() {
		s := m.seqs[id]
		if err := m.checkSeq(s); err != nil {
			return err
		}
		if other, dup := rows[s.row]; dup {
			return fmt.Errorf("row %d assigned to requests %d and %d", s.row, other, id)
		}
		rows[s.row] = id
		for k, b := range s.blocks {
			loc := b.where()
			if int(loc.page) < 0 || int(loc.page) >= m.tierOf(loc.tier).numPages() {
				return fmt.Errorf("request %d block %d: %s page %d out of range", id, k, loc.tier, loc.page)
			}
			if s.status == SeqActive {
				refs[loc.tier][loc.page][0]++
			} else {
				refs[loc.tier][loc.page][1]++
			}
			if b.n == nil {
				private[loc.tier][loc.page]++
			}
		}
		reserved += s.reservation()
	}
	cached, held := 0, 0
	for t, p := range []*tierPool{&m.gpu, &m.host} {
		tier := Tier(t)
		inFree := make([]bool, p.numPages())
		for _, pg := range p.freePages() {
			inFree[pg] = true
		}
		for pg := range p.numPages() {
			want := refs[t][pg]
			if want[0] != p.locks[pg] || want[1] != p.holds[pg] {
				return fmt.Errorf("%s page %d: counts locks %d holds %d, sequences say %d and %d",
					tier, pg, p.locks[pg], p.holds[pg], want[0], want[1])
			}
			n := p.owner[pg]
			if private[t][pg] > 0 && (n != nil || want[0]+want[1] != 1) {
				return fmt.Errorf("%s page %d: private page owned twice or by a block", tier, pg)
			}
			if n != nil && (n.loc != pageLoc{tier, int32(pg)}) {
				return fmt.Errorf("%s page %d: owner block lives at %s page %d", tier, pg, n.loc.tier, n.loc.page)
			}
			total := want[0] + want[1]
			if tier == TierGPU && want[0] == 0 && want[1] > 0 {
				held++
			}
			switch {
			case inFree[pg] && (total > 0 || n != nil):
				return fmt.Errorf("%s page %d is free and owned", tier, pg)
			case inFree[pg] || total > 0:
			case n != nil && n.inTree && tier == TierGPU:
				if !n.cached {
					return fmt.Errorf("gpu page %d: unreferenced block not marked cached", pg)
				}
				cached++
			default:
				return fmt.Errorf("%s page %d leaked: neither free, referenced nor cached", tier, pg)
			}
		}
	}
	if held != m.heldGPU {
		return fmt.Errorf("heldGPU %d, pages say %d", m.heldGPU, held)
	}
	if err := m.checkTree(cached); err != nil {
		return err
	}
	if reserved != m.reserved {
		return fmt.Errorf("reserved counter %d != Σ reservations %d", m.reserved, reserved)
	}
	if m.reserved > m.obtainable() {
		return fmt.Errorf("reserved %d > obtainable %d: a reservation cannot be honoured", m.reserved, m.obtainable())
	}
	return nil
}

// checkFreeList verifies one tier's free set: its count, no page beyond
// the pool, and the summary words.
func (m *Manager) checkFreeList(p *tierPool, tier Tier) error {
	pages := p.freePages()
	if len(pages) != p.nfree {
		return fmt.Errorf("%s free set: %d pages listed, count %d", tier, len(pages), p.nfree)
	}
	if len(pages) > 0 && int(pages[len(pages)-1]) >= p.numPages() {
		return fmt.Errorf("%s free set: page %d out of range [0, %d)", tier, pages[len(pages)-1], p.numPages())
	}
	for w, word := range p.free {
		if got := p.sum[w/64]&(1<<(w%64)) != 0; got != (word != 0) {
			return fmt.Errorf("%s free set: summary bit of word %d is %v", tier, w, got)
		}
		if word != 0 && w/64 < p.lo {
			return fmt.Errorf("%s free set: word %d below the low mark %d", tier, w, p.lo)
		}
	}
	return nil
}

// checkTree verifies the radix tree against the cached page count.
func (m *Manager) checkTree(cachedPages int) error {
	cached, leaves := 0, 0
	for _, salt := range m.rootSalts() {
		var err error
		var walk func(n *node)
		walk = func(n *node) {
			for _, c := range n.children {
				if err != nil {
					return
				}
				switch {
				case c.parent != n || !c.inTree || m.nodes[nodeIndex(c.key)] != c:
					err = fmt.Errorf("block %x: broken parent/child/map link", c.key[:4])
				case m.tierOf(c.loc.tier).owner[c.loc.page] != c:
					err = fmt.Errorf("block %x: page %s %d not owned by it", c.key[:4], c.loc.tier, c.loc.page)
				case len(c.tokens) == 0 || len(c.tokens) > m.lb:
					err = fmt.Errorf("block %x: %d tokens", c.key[:4], len(c.tokens))
				case m.ev.enabled && !c.tracked:
					err = fmt.Errorf("block %x: in the tree but not tracked (stored event missing)", c.key[:4])
				case c.key != LookupKeyOf(n.key, c.tokens):
					err = fmt.Errorf("block %x: not its lookup key", c.key[:4])
				case m.ev.enabled && c.hash != BlockKeyOf(n.hash, c.tokens):
					err = fmt.Errorf("block %x: event hash is not the SHA-256 chain key", c.key[:4])
				}
				if err != nil {
					return
				}
				refs := m.tierOf(c.loc.tier).refs(c.loc.page)
				if c.loc.tier == TierHost && refs == 0 {
					err = fmt.Errorf("block %x: unreferenced block on the host", c.key[:4])
					return
				}
				if c.cached != (c.loc.tier == TierGPU && refs == 0) {
					err = fmt.Errorf("block %x: cached flag %v wrong", c.key[:4], c.cached)
					return
				}
				if c.cached {
					cached++
				}
				inHeap := c.heapIdx >= 0 && c.heapIdx < len(m.leaves) && m.leaves[c.heapIdx] == c
				if inHeap != (c.cached && c.isLeaf()) {
					err = fmt.Errorf("block %x: leaf heap membership %v wrong", c.key[:4], inHeap)
					return
				}
				if inHeap {
					leaves++
				}
				walk(c)
			}
		}
		walk(m.roots[salt])
		if err != nil {
			return err
		}
	}
	inTree := 0
	for _, n := range m.nodes {
		if !n.isRoot {
			inTree++
		}
	}
	if walked := m.countNodes(); walked != inTree {
		return fmt.Errorf("tree map holds %d blocks, %d reachable", inTree, walked)
	}
	if cached != m.numCached || cached != cachedPages {
		return fmt.Errorf("cached: counter %d, tree %d, pages %d", m.numCached, cached, cachedPages)
	}
	if leaves != len(m.leaves) {
		return fmt.Errorf("leaf heap holds %d entries, %d cached leaves", len(m.leaves), leaves)
	}
	for i := 1; i < len(m.leaves); i++ {
		if m.leaves.less(i, (i-1)/2) {
			return fmt.Errorf("leaf heap order broken at slot %d", i)
		}
	}
	return nil
}

// countNodes counts the blocks reachable from the roots.
func (m *Manager) countNodes() int {
	count := 0
	var walk func(*node)
	walk = func(n *node) {
		for _, c := range n.children {
			count++
			walk(c)
		}
	}
	for _, salt := range m.rootSalts() {
		walk(m.roots[salt])
	}
	return count
}

// checkSeq verifies one sequence's lengths, status and row content.
func (m *Manager) checkSeq(s *sequence) error {
	switch {
	case s.status != SeqActive && s.status != SeqSuspended:
		return fmt.Errorf("request %d: open sequence with status %s", s.id, s.status)
	case s.committed < 0 || s.committed > s.history:
		return fmt.Errorf("request %d: committed %d not in [0, history %d]", s.id, s.committed, s.history)
	case s.history > s.capacity:
		return fmt.Errorf("request %d: history %d > capacity %d", s.id, s.history, s.capacity)
	case len(s.blocks) != ceilDiv(s.capacity, m.lb):
		return fmt.Errorf("request %d: %d blocks for capacity %d (want %d)", s.id, len(s.blocks), s.capacity, ceilDiv(s.capacity, m.lb))
	case m.maxCapacity > 0 && s.capacity > m.maxCapacity:
		return fmt.Errorf("request %d: capacity %d > MaxSeqLen+1 = %d", s.id, s.capacity, m.maxCapacity)
	case s.partialPending && s.status == SeqActive:
		return fmt.Errorf("request %d: active with a pending copy-on-resume block", s.id)
	case s.row < 0:
		return fmt.Errorf("request %d: no page-table row", s.id)
	}
	if s.status == SeqActive {
		table := make([]int32, 0, len(s.blocks))
		for k, b := range s.blocks {
			if b.where().tier != TierGPU {
				return fmt.Errorf("request %d: active with block %d on the host", s.id, k)
			}
			table = append(table, b.where().page)
		}
		if !slices.Equal(table, s.table) {
			return fmt.Errorf("request %d: row %v, blocks say %v", s.id, s.table, table)
		}
	}
	return nil
}
