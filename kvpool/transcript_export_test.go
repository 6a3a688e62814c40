package kvpool

import (
	"cmp"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// What the transcript test (transcript_test.go, package kvpool_test) reads
// of the manager's private state to print it: the free lists, each open
// sequence's pages and the radix tree with its reference counts. Read-only
// views, built fresh on every call.

// SnapPage is one page of a sequence: where it is and whether it is a radix
// block's page (shared through the tree) or private to the sequence.
// Detached: the block was replaced by a longer one and left the tree (§6.5);
// the page stays with the sequences still using it.
type SnapPage struct {
	Tier     Tier
	Page     int32
	Block    bool
	Detached bool
	Key      scheduler.BlockKey // the block's key when Block
}

// SnapBlock is one radix block, in pre-order (children in insertion order).
type SnapBlock struct {
	Depth        int // 0 for a child of a root
	Salt         string
	Key          scheduler.BlockKey
	Tokens       []int32
	Tier         Tier
	Page         int32
	Locks, Holds int32
	Cached       bool
}

// SnapFree returns tier's free pages in increasing order.
func (m *Manager) SnapFree(t Tier) []int32 {
	return m.tierOf(t).freePages()
}

// SnapSequenceIDs lists the open sequences in id order.
func (m *Manager) SnapSequenceIDs() []uint64 { return m.sortedIDs() }

// SnapPages returns id's pages in block order (nil without a cache).
func (m *Manager) SnapPages(id uint64) []SnapPage {
	s, ok := m.seqs[id]
	if !ok {
		return nil
	}
	out := make([]SnapPage, 0, len(s.blocks))
	for _, b := range s.blocks {
		loc := b.where()
		p := SnapPage{Tier: loc.tier, Page: loc.page, Block: b.n != nil}
		if b.n != nil {
			p.Key, p.Detached = b.n.hash, !b.n.inTree
		}
		out = append(out, p)
	}
	return out
}

// SnapTree returns every radix block, scope by scope (salts in sorted
// order), each tree in pre-order.
func (m *Manager) SnapTree() []SnapBlock {
	var out []SnapBlock
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		p := m.tierOf(n.loc.tier)
		out = append(out, SnapBlock{Depth: depth, Salt: n.salt, Key: n.hash, Tokens: n.tokens,
			Tier: n.loc.tier, Page: n.loc.page, Locks: p.locks[n.loc.page], Holds: p.holds[n.loc.page], Cached: n.cached})
		for _, c := range n.children {
			walk(c, depth+1)
		}
	}
	for _, salt := range m.rootSalts() {
		for _, c := range m.roots[salt].children {
			walk(c, 0)
		}
	}
	return out
}

// SnapEvictionOrder lists the cached leaf blocks in the order allocation
// drops them (§4.2 step 3: least recently used first, ties by page).
func (m *Manager) SnapEvictionOrder() []scheduler.BlockKey {
	leaves := slices.Clone(m.leaves)
	slices.SortFunc(leaves, func(a, b *node) int {
		if c := cmp.Compare(a.lastUse, b.lastUse); c != 0 {
			return c
		}
		return cmp.Compare(a.loc.page, b.loc.page)
	})
	out := make([]scheduler.BlockKey, len(leaves))
	for i, n := range leaves {
		out[i] = n.hash
	}
	return out
}
