package kvpool

import "fmt"

// Page reference counting (kvcache.md §4.1). Every change of a page's lock
// or hold count goes through these helpers, which keep the derived state in
// step: the heldGPU counter, the cached set and leaf heap of the radix tree,
// and the free lists. Settling a page after its last reference is released:
//
//	private page              → free list
//	radix block on the GPU    → cached (evictable, LRU-stamped)
//	radix block on the host   → dropped with its subtree (the host tier keeps
//	                            only pages of suspended sequences)
//	detached block            → free list

// tierOf returns the pool of a tier.
func (m *Manager) tierOf(t Tier) *tierPool {
	if t == TierHost {
		return &m.host
	}
	return &m.gpu
}

// adjust changes loc's lock and hold counts by dl and dh and settles it.
func (m *Manager) adjust(loc pageLoc, dl, dh int32) {
	p := m.tierOf(loc.tier)
	pg := loc.page
	wasHeld := p.locks[pg] == 0 && p.holds[pg] > 0
	wasFree := p.locks[pg]+p.holds[pg] == 0
	p.locks[pg] += dl
	p.holds[pg] += dh
	if p.locks[pg] < 0 || p.holds[pg] < 0 {
		panic(fmt.Sprintf("kvpool: invariant page-refcount: %s page %d locks %d holds %d",
			loc.tier, pg, p.locks[pg], p.holds[pg]))
	}
	if loc.tier == TierGPU {
		isHeld := p.locks[pg] == 0 && p.holds[pg] > 0
		if wasHeld != isHeld {
			if isHeld {
				m.heldGPU++
			} else {
				m.heldGPU--
			}
		}
	}
	// A page's settled state depends only on whether anything references
	// it, so only a transition to or from zero references needs settling.
	if wasFree != (p.locks[pg]+p.holds[pg] == 0) {
		m.settle(loc)
	}
}

// addRef adds one lock (active) or hold (suspended) to loc.
func (m *Manager) addRef(loc pageLoc, active bool) {
	if active {
		m.adjust(loc, 1, 0)
	} else {
		m.adjust(loc, 0, 1)
	}
}

// dropRef releases one lock (active) or hold (suspended) on loc.
func (m *Manager) dropRef(loc pageLoc, active bool) {
	if active {
		m.adjust(loc, -1, 0)
	} else {
		m.adjust(loc, 0, -1)
	}
}

// release drops a sequence's reference to block b. A private GPU page
// locked once (the common case: a sequence's own tail) goes straight back
// to the free list; everything else takes the general path.
func (m *Manager) release(b blockRef, active bool) {
	if pg := b.loc.page; b.n == nil && active && b.loc.tier == TierGPU && m.gpu.locks[pg] == 1 && m.gpu.holds[pg] == 0 {
		m.gpu.locks[pg] = 0
		m.gpu.put(pg)
		return
	}
	m.dropRef(b.where(), active)
}

// lockToHold turns an active reference into a suspended one (suspend).
func (m *Manager) lockToHold(loc pageLoc) { m.adjust(loc, -1, 1) }

// holdToLock turns a suspended reference into an active one (resume).
func (m *Manager) holdToLock(loc pageLoc) { m.adjust(loc, 1, -1) }

// settle re-derives the state of loc after a reference change.
func (m *Manager) settle(loc pageLoc) {
	p := m.tierOf(loc.tier)
	n := p.owner[loc.page]
	if n == nil {
		if p.refs(loc.page) == 0 {
			p.put(loc.page)
		}
		return
	}
	m.settleNode(n)
}

// settleNode re-derives a radix block's state from its page's references.
func (m *Manager) settleNode(n *node) {
	refs := m.tierOf(n.loc.tier).refs(n.loc.page)
	switch {
	case !n.inTree:
		if refs == 0 { // a detached block nobody uses: its page is free
			m.releasePage(n)
		}
	case n.loc.tier == TierGPU:
		m.setCached(n, refs == 0)
	case refs == 0: // an unreferenced block on the host is dropped, never kept
		if !m.dropSubtree(n) {
			panic("kvpool: invariant host-block-subtree: an unreferenced host block has a referenced descendant")
		}
	}
}

// setCached moves an in-tree GPU block into or out of the cached set. A
// block becoming cached is stamped with the next use tick (§4.2: "recently
// used" is bumped whenever a block becomes cached).
func (m *Manager) setCached(n *node, cached bool) {
	if n.cached == cached {
		return
	}
	n.cached = cached
	if cached {
		m.numCached++
		m.tick++
		n.lastUse = m.tick
		if n.isLeaf() {
			m.leaves.push(n)
		}
		return
	}
	m.numCached--
	m.leaves.remove(n)
}

// releasePage frees the page of a block that leaves the tree unreferenced.
func (m *Manager) releasePage(n *node) {
	p := m.tierOf(n.loc.tier)
	if p.owner[n.loc.page] == n {
		p.owner[n.loc.page] = nil
		p.put(n.loc.page)
	}
}

// moveRefs moves every reference of page from to page to (a migration
// between tiers): counts, owner, and the heldGPU counter. from ends free of
// references and owner; the caller returns it to its free list.
func (m *Manager) moveRefs(from, to pageLoc) {
	fp, tp := m.tierOf(from.tier), m.tierOf(to.tier)
	if from.tier == TierGPU && fp.locks[from.page] == 0 && fp.holds[from.page] > 0 {
		m.heldGPU--
	}
	tp.locks[to.page], tp.holds[to.page] = fp.locks[from.page], fp.holds[from.page]
	fp.locks[from.page], fp.holds[from.page] = 0, 0
	tp.owner[to.page], fp.owner[from.page] = fp.owner[from.page], nil
	if to.tier == TierGPU && tp.locks[to.page] == 0 && tp.holds[to.page] > 0 {
		m.heldGPU++
	}
}
