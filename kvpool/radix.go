package kvpool

import (
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// node is a radix-tree block (kvcache.md §6.2): a committed run of up to one
// ledger block of prompt tokens with its page, or a scope's root (no page).
//
// Keys are unique (a hash chain), so one map of every in-tree node serves
// all lookups; children are kept as well, in insertion order, for the
// partial match (§6.3) and the pre-order of removals (§6.6).
type node struct {
	key scheduler.BlockKey // lookup key (LookupKeyOf): the key of Manager.nodes
	// hash is the block's §6.1 SHA-256 chain key, as events carry it,
	// computed once when the block is stored (zero without events: nothing
	// else reads it).
	hash     scheduler.BlockKey
	tokens   []int32 // the block's tokens: P for a full block, fewer for a partial one
	parent   *node   // nil for a root
	children []*node // insertion order
	loc      pageLoc // the page; meaningless for a root
	isRoot   bool
	salt     string // the scope's cache salt (for stored events)

	// inTree: reachable from the map. A detached node (a replaced partial
	// sibling, §6.5) stays alive while sequences still reference its page.
	inTree bool
	// cached: in the tree, on the GPU and referenced by no sequence; counted
	// in Manager.numCached and evictable (§4.1).
	cached bool
	// lastUse orders cached leaves for eviction (LRU; ties: lower page).
	lastUse uint64
	// heapIdx is the node's slot in the leaf heap, -1 when not in it. The
	// heap holds exactly the cached nodes without children.
	heapIdx int
	// tracked: a stored event was buffered and no removed event yet (§9.1).
	tracked bool
	// childGen counts the changes of children (insertions, removals), so
	// that a request's kept match ending here knows it still holds
	// (matchMemo).
	childGen uint64
	// partialChildren counts children holding fewer than a ledger block of
	// tokens, so that committing a full block skips the sibling scan when
	// no partial sibling exists.
	partialChildren int
}

// isLeaf reports whether n has no children.
func (n *node) isLeaf() bool { return len(n.children) == 0 }

// removeChild unlinks c from n's children, keeping insertion order.
func (n *node) removeChild(c *node) {
	if i := slices.Index(n.children, c); i >= 0 {
		n.children = slices.Delete(n.children, i, i+1)
	}
}

// leafHeap is a binary min-heap of cached leaf nodes ordered by
// (lastUse, page): the eviction order of §4.2 step 3. Each node records its
// slot, so removal from the middle is O(log n).
type leafHeap []*node

// less orders by least recent use, then lower page index.
func (h leafHeap) less(i, j int) bool {
	if h[i].lastUse != h[j].lastUse {
		return h[i].lastUse < h[j].lastUse
	}
	return h[i].loc.page < h[j].loc.page
}

func (h leafHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}

// push adds n (not in the heap).
func (h *leafHeap) push(n *node) {
	n.heapIdx = len(*h)
	*h = append(*h, n)
	h.up(n.heapIdx)
}

// remove deletes n if it is in the heap.
func (h *leafHeap) remove(n *node) {
	i := n.heapIdx
	if i < 0 {
		return
	}
	last := len(*h) - 1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	n.heapIdx = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// fix restores the heap order after n's key changed (n in the heap or not).
func (h leafHeap) fix(n *node) {
	if i := n.heapIdx; i >= 0 {
		h.down(i)
		h.up(i)
	}
}

func (h leafHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h leafHeap) down(i int) {
	n := len(h)
	for {
		least := i
		if l := 2*i + 1; l < n && h.less(l, least) {
			least = l
		}
		if r := 2*i + 2; r < n && h.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		h.swap(i, least)
		i = least
	}
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// maxPartialChildren: a partial match is not attempted under a node with
// this many children or more (§6.3 step 2), bounding the scan.
const maxPartialChildren = 32
