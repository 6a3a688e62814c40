package kvpool

import (
	"cmp"
	"slices"
)

// GPU page allocation (kvcache.md §4.2) and the resume that brings pages
// back from the host (§5.2).
//
// Allocation of n pages is all-or-nothing: feasibility is checked first,
// without side effects, then pages are obtained in the spec's order: free
// pages (lowest index first), then cached blocks dropped least recently used
// leaf first, then held pages migrated to the host tier.

// migratable is the number of GPU pages that can be moved to the host now:
// held pages (every holder suspended), limited by the free host pages.
func (m *Manager) migratable() int { return min(m.heldGPU, m.host.numFree()) }

// obtainable is how many GPU pages an allocation could get in total.
func (m *Manager) obtainable() int { return m.gpu.numFree() + m.numCached + m.migratable() }

// canObtain reports whether n pages can be allocated while reservedAfter
// pages (the reservations of every sequence once the allocation is done)
// stay covered.
func (m *Manager) canObtain(n, reservedAfter int) bool {
	return n <= m.obtainable()-reservedAfter
}

// makeFree ensures at least n free GPU pages by dropping cached leaves, then
// migrating held pages. The caller checked canObtain.
func (m *Manager) makeFree(n int) {
	for m.gpu.numFree() < n && len(m.leaves) > 0 {
		m.removeNode(m.leaves[0], true)
	}
	if m.gpu.numFree() < n {
		m.migrateHeld(n)
	}
	if m.gpu.numFree() < n {
		panic("kvpool: invariant allocation-feasible: canObtain promised pages that could not be freed")
	}
}

// migrateHeld moves held GPU pages to the host until n GPU pages are free
// (§4.2 step 4): the sequence suspended longest ago first (ties: lower id),
// its blocks from the highest index down. Each migration takes the lowest
// free host page, queues a GPU→host copy, moves the page's references and
// frees the GPU page; a committed block emits updated (level 0 → 1).
func (m *Manager) migrateHeld(n int) {
	victims := make([]*sequence, 0, len(m.seqs))
	for _, s := range m.seqs {
		if s.status == SeqSuspended {
			victims = append(victims, s)
		}
	}
	slices.SortFunc(victims, func(a, b *sequence) int {
		if c := cmp.Compare(a.suspendedAt, b.suspendedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	for _, s := range victims {
		for k := len(s.blocks) - 1; k >= 0; k-- {
			if m.gpu.numFree() >= n || m.host.numFree() == 0 {
				return
			}
			loc := s.blocks[k].where()
			if loc.tier != TierGPU || m.gpu.locks[loc.page] != 0 {
				continue // already on the host, or some active sequence uses it
			}
			dst := m.movePage(loc, TierHost)
			if s.blocks[k].n == nil {
				s.blocks[k].loc = dst // a private page has exactly one holder: s
			}
		}
	}
}

// movePage moves the page at from to the lowest free page of tier to,
// queuing the copy and freeing from. A radix block follows its page (every
// holder sees the new location) and emits updated. It returns the new
// location; the caller updates a private blockRef.
func (m *Manager) movePage(from pageLoc, to Tier) pageLoc {
	dst := pageLoc{to, m.tierOf(to).take()}
	m.queueCopy(from, dst)
	n := m.tierOf(from.tier).owner[from.page]
	m.moveRefs(from, dst)
	m.tierOf(from.tier).put(from.page)
	if n != nil {
		n.loc = dst
		m.ev.updated(n, int(from.tier), int(to))
	}
	return dst
}

// resume makes a suspended sequence ACTIVE (§5.2). When some page is on the
// host, it refuses while GPU utilisation exceeds MaxUtilForResume. It
// allocates one GPU page per host page and one for a copy-on-resume partial
// block (§6.4) in one all-or-nothing allocation, queues the copies, turns
// holds into locks and rebuilds the row. On false nothing changed.
func (m *Manager) resume(s *sequence) bool {
	if s.status == SeqActive {
		return true
	}
	partial := -1
	if s.partialPending {
		partial = len(s.blocks) - 1
	}
	hostBlocks := 0
	if s.claimedLocked {
		// Claimed as locks just now (claimPrefix): every block is on the
		// GPU and already locked.
		s.claimedLocked = false
	} else {
		anyHost := false
		for k, b := range s.blocks {
			if b.where().tier == TierHost {
				anyHost = true
				if k != partial {
					hostBlocks++
				}
			}
		}
		if anyHost && m.Utilization() > m.maxUtil {
			return false
		}
		// Lock the GPU-resident pages first, so that this allocation cannot
		// migrate the sequence's own pages to the host.
		for _, b := range s.blocks {
			if loc := b.where(); loc.tier == TierGPU {
				m.holdToLock(loc)
			}
		}
	}
	need := hostBlocks
	if partial >= 0 {
		need++
	}
	if need > 0 && !m.canObtain(need, m.reserved) && partial >= 0 && m.adoptable(s, partial) &&
		m.canObtain(need-1, m.reserved) {
		// Too short of pages for the copy, but s alone holds the shared
		// partial block: without s it would be cached and evictable, so
		// evict it for s and keep its page (and content) instead of copying.
		m.adoptPartial(s, partial)
		partial = -1
		need--
	}
	if need > 0 {
		if !m.canObtain(need, m.reserved) {
			for _, b := range s.blocks {
				if loc := b.where(); loc.tier == TierGPU {
					m.lockToHold(loc)
				}
			}
			return false
		}
		m.makeFree(need)
		for k := range s.blocks {
			if loc := s.blocks[k].where(); k != partial && loc.tier == TierHost {
				dst := m.movePage(loc, TierGPU)
				m.holdToLock(dst)
				if s.blocks[k].n == nil {
					s.blocks[k].loc = dst
				}
			}
		}
		if partial >= 0 {
			m.copyOnResume(s, partial)
		}
	}
	s.status = SeqActive
	s.rebuildTable()
	return true
}

// copyOnResume gives block k (a shared partial radix block the sequence
// will write the rest of) a private GPU page holding a copy of the shared
// one, then releases the shared page (§6.4). The copy is queued before the
// release, so the shared page cannot be reused ahead of it.
func (m *Manager) copyOnResume(s *sequence, k int) {
	src := s.blocks[k].where()
	dst := pageLoc{TierGPU, m.gpu.take()}
	m.addRef(dst, true)
	m.queueCopy(src, dst)
	m.dropRef(src, src.tier == TierGPU) // locked above when on the GPU, else held
	s.blocks[k] = blockRef{loc: dst}
	s.partialPending = false
}

// adoptable reports whether block k of s (a shared partial radix block) is
// referenced by s alone and on the GPU: nobody else would lose it if it were
// evicted, so s may take its page over (adoptPartial).
func (m *Manager) adoptable(s *sequence, k int) bool {
	b := s.blocks[k]
	if b.n == nil || b.n.loc.tier != TierGPU || m.gpu.refs(b.n.loc.page) != 1 {
		return false
	}
	// A partial match may be a prefix of a full block with descendants. A
	// sequence using a descendant would hold this block too, so with s the
	// only holder they are all cached; check it rather than assume it.
	for _, c := range b.n.children {
		if !m.unreferenced(c) {
			return false
		}
	}
	return true
}

// unreferenced reports whether no block of n's subtree is locked or held.
func (m *Manager) unreferenced(n *node) bool {
	if m.tierOf(n.loc.tier).refs(n.loc.page) != 0 {
		return false
	}
	for _, c := range n.children {
		if !m.unreferenced(c) {
			return false
		}
	}
	return true
}

// adoptPartial evicts the shared partial block k of s, which only s
// references (with its cached descendants, when the match was a prefix of a
// full block), and makes its page s's private page with its content intact:
// the copy-on-resume of §6.4 without the copy and without a second page.
// This is what "cached blocks that only the cache holds are always evictable
// for a requester, including blocks the requester matched itself" means for
// a partial match: a request that fits the pool alone must not need one
// page more because it matched. The block leaves the radix tree (a removed
// event when it was published), exactly as an LRU eviction would.
func (m *Manager) adoptPartial(s *sequence, k int) {
	n := s.blocks[k].n
	loc := n.loc
	for len(n.children) > 0 { // cached descendants go first (adoptable checked them)
		if !m.dropSubtree(n.children[0]) {
			panic("kvpool: invariant adopt-unreferenced-subtree: a descendant of an adopted block is in use")
		}
	}
	if n.inTree {
		m.ev.removed(n)
		m.unlink(n)
	}
	m.gpu.owner[loc.page] = nil
	s.blocks[k] = blockRef{loc: loc}
	s.partialPending = false
}
