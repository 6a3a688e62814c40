package kvpool

import (
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Radix-tree operations (kvcache.md §6): roots, insertion, removal, match.

// rootFor returns the root of salt's scope, creating it when create is set
// (nil otherwise when missing). Roots have no page and are never removed.
func (m *Manager) rootFor(salt string, create bool) *node {
	if n := m.roots[salt]; n != nil {
		return n
	}
	if !create {
		return nil
	}
	n := &node{key: LookupRootKey(salt), hash: RootKey(salt), isRoot: true, salt: salt, inTree: true, heapIdx: -1}
	m.nodes[nodeIndex(n.key)] = n
	m.roots[salt] = n
	return n
}

// saltOf is r's cache salt ("" without Config.CacheSalt).
func (m *Manager) saltOf(r *scheduler.Request) string {
	if m.cfg.CacheSalt == nil {
		return ""
	}
	return m.cfg.CacheSalt(r)
}

// insert adds a block under parent whose page is loc (already referenced by
// the committing sequence, which keeps its reference). The caller checked
// that the key is absent.
func (m *Manager) insert(parent *node, key scheduler.BlockKey, tokens []int32, loc pageLoc) *node {
	n := &node{key: key, tokens: append([]int32(nil), tokens...), parent: parent, loc: loc,
		salt: parent.salt, inTree: true, heapIdx: -1}
	// The §6.1 key, which only events carry: once per stored block, not
	// per lookup, and not at all without events (a block's parent is
	// stored before it, so with events every hash in the tree is set).
	if m.ev.enabled {
		n.hash = m.hasher.sha(parent.hash, tokens)
	}
	m.nodes[nodeIndex(key)] = n
	parent.childGen++
	if parent.cached { // a cached leaf that gains a child is no longer a leaf
		m.leaves.remove(parent)
	}
	parent.children = append(parent.children, n)
	if len(tokens) < m.lb {
		parent.partialChildren++
	}
	m.tierOf(loc.tier).owner[loc.page] = n
	m.ev.stored(n, m.lb)
	return n
}

// unlink takes n out of the tree without touching its page: out of the map,
// off its parent's children and out of the cached set. The parent may
// become a cached leaf.
func (m *Manager) unlink(n *node) {
	m.setCached(n, false)
	delete(m.nodes, nodeIndex(n.key))
	n.inTree = false
	p := n.parent
	p.removeChild(n)
	p.childGen++
	if len(n.tokens) < m.lb {
		p.partialChildren--
	}
	if p.cached && p.isLeaf() {
		m.leaves.push(p)
	}
}

// removeNode drops an unreferenced block (a cached leaf under eviction, or
// a node of a subtree being dropped): removed event when emit is set and the
// block is tracked, then its page is freed.
func (m *Manager) removeNode(n *node, emit bool) {
	if emit {
		m.ev.removed(n)
	}
	m.unlink(n)
	m.releasePage(n)
}

// detach takes a partial sibling out of the tree when a longer block
// replaces it (§6.5): removed event; its page stays private to the
// sequences still referencing it and is freed otherwise.
func (m *Manager) detach(n *node) {
	m.ev.removed(n)
	m.unlink(n)
	if m.tierOf(n.loc.tier).refs(n.loc.page) == 0 {
		m.releasePage(n)
	}
}

// dropSubtree removes n with its whole subtree if no block of it is locked
// or held (§6.6), emitting one removed event with the keys in pre-order
// (children in insertion order). It returns false, changing nothing, when
// some block is referenced.
func (m *Manager) dropSubtree(n *node) bool {
	var order []*node
	var walk func(*node) bool
	walk = func(x *node) bool {
		if m.tierOf(x.loc.tier).refs(x.loc.page) != 0 {
			return false
		}
		order = append(order, x)
		for _, c := range x.children {
			if !walk(c) {
				return false
			}
		}
		return true
	}
	if !walk(n) {
		return false
	}
	for _, x := range order {
		m.ev.removed(x)
	}
	for i := len(order) - 1; i >= 0; i-- { // children before parents
		m.removeNode(order[i], false)
	}
	return true
}

// ClearReusableBlocks drops every block of the radix tree. It requires every
// cache to be closed (§6.6) and panics otherwise.
func (m *Manager) ClearReusableBlocks() {
	if len(m.seqs) != 0 {
		panic("kvpool: invariant clear-requires-closed: ClearReusableBlocks with open caches")
	}
	for _, salt := range m.rootSalts() {
		root := m.roots[salt]
		for len(root.children) > 0 {
			m.dropSubtree(root.children[0])
		}
	}
}

// rootSalts lists the scopes' salts in sorted order (deterministic).
func (m *Manager) rootSalts() []string {
	var salts []string
	for salt := range m.roots {
		salts = append(salts, salt)
	}
	slices.Sort(salts)
	return salts
}

// matchResult is the outcome of §6.3 on a request's lookup tokens.
type matchResult struct {
	root    *node
	full    []*node // matched full blocks, in order
	partial *node   // the partially matched block, or nil
	q       int     // tokens matched in partial
	// firstNew is the key of the first full lookup block that step 1 did
	// not match; hasNew is false when no further full block exists.
	firstNew scheduler.BlockKey
	hasNew   bool
}

// tokens is the matched length m.
func (r matchResult) tokens(lb int) int { return len(r.full)*lb + r.q }

// match runs §6.3 on r's lookup tokens (res.full is the manager's scratch,
// valid until the next match) (the prompt without its last token):
// step 1 walks full blocks while the key exists and its page is on the GPU;
// step 2 (partial reuse on) takes the longest common token prefix with a GPU
// child of the last matched node, unless it has 32 or more children. The
// chain keys come from r's key chain (promptKey), which may grow; nothing
// else changes.
func (m *Manager) match(r *scheduler.Request) matchResult {
	res := matchResult{full: m.fullScratch[:0]}
	res.root = m.rootFor(m.saltOf(r), false)
	n := len(r.Tokens) - 1
	if n > r.PromptLen-1 {
		n = r.PromptLen - 1
	}
	if n <= 0 || r.NoReuse {
		return res
	}
	lookup := r.Tokens[:n]
	var rootKey scheduler.BlockKey
	if res.root != nil {
		rootKey = res.root.key
	} else {
		rootKey = LookupRootKey(m.saltOf(r))
	}
	last := res.root
	c := m.keyChain(r, rootKey)
	for k := 0; (k+1)*m.lb <= len(lookup); k++ {
		m.growChain(c, r, rootKey, k)
		key := c.Keys[k]
		b := m.lookupChild(last, key, lookup[k*m.lb:(k+1)*m.lb])
		if b == nil || b.loc.tier != TierGPU {
			res.firstNew, res.hasNew = key, true
			break
		}
		res.full = append(res.full, b)
		last = b
	}
	res.partial, res.q = m.partialMatch(lookup, last, len(res.full))
	return res
}

// partialMatch is step 2 of match: the GPU child of last (the node of the
// full matched blocks' end) with the longest common token prefix with the
// lookup tokens after them, unless partial reuse is off or last has 32 or
// more children.
func (m *Manager) partialMatch(lookup []int32, last *node, full int) (*node, int) {
	if m.cfg.DisablePartialReuse || last == nil || len(last.children) >= maxPartialChildren {
		return nil, 0
	}
	start := full * m.lb
	rest := lookup[start:min(len(lookup), start+m.lb)]
	var best *node
	q := 0
	for _, c := range last.children {
		if c.loc.tier != TierGPU {
			continue
		}
		if k := commonPrefix(c.tokens, rest); k > q {
			best, q = c, k
		}
	}
	return best, q
}
