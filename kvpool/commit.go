package kvpool

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Prefix reuse from the sequence's side (kvcache.md §5.4, §6.4, §6.5, §7):
// claiming a match at creation, committing blocks as prefill advances, and
// the PER_CONVERSATION drop plans.

// claimPrefix runs the match for a fresh cache of a first chunk and takes
// the matched blocks as holds (§6.4): full blocks are shared; a partial
// block is shared until the first resume copies it (copy-on-resume). The
// three lengths start at m and r.ContextPosition = m.
//
// Reservation guard: blocks that were cached stop counting as available
// once held. Under GUARANTEED_NO_EVICT the match is truncated so that the
// cached pages it takes never uncover another request's reservation.
//
// locked takes the blocks as locks instead, for a caller that resumes the
// sequence at once (PrepareContext): the matched blocks are all on the GPU,
// so resume's hold-to-lock pass would only turn each hold into a lock, and
// taking locks now saves that second walk of a long prompt's blocks (issue
// 24, item 6). s.claimedLocked tells resume; the outcome is the same.
func (m *Manager) claimPrefix(s *sequence, r *scheduler.Request, locked bool) {
	if !m.cfg.EnableBlockReuse {
		return
	}
	s.root = m.rootFor(m.saltOf(r), true)
	if r.ContextPosition != 0 {
		return
	}
	km := m.cachedMatch(r)
	res := matchResult{full: m.fullBlocks(km), partial: km.partial, q: km.q}
	s.claimedLocked = locked
	slack := m.gpu.numFree() + m.numCached - m.reserved
	take := func(n *node) bool {
		if n.cached {
			if slack <= 0 {
				return false
			}
			slack--
			s.claimStamps = append(s.claimStamps, claimStamp{n, n.lastUse})
		}
		m.addRef(n.loc, locked)
		s.blocks = append(s.blocks, blockRef{n: n})
		s.table = append(s.table, n.loc.page)
		return true
	}
	matched := 0
	for _, b := range res.full {
		if !take(b) {
			break
		}
		matched += m.lb
	}
	if res.partial != nil && matched == len(res.full)*m.lb && take(res.partial) {
		matched += res.q
		s.partialPending = true
	}
	clear(res.full) // the manager's scratch: no node stays reachable through it
	s.capacity, s.history, s.committed, s.reusedTokens = matched, matched, matched, matched
	r.ContextPosition = matched
}

// keyAt returns the chain key of full block k of r's prompt under s's root.
func (m *Manager) keyAt(s *sequence, r *scheduler.Request, k int) scheduler.BlockKey {
	return m.promptKey(r, s.root.key, k)
}

// promptKey returns the chain key of full block k of r's tokens under the
// root key root, from r's key chain, hashing only the blocks the chain does
// not hold yet. A chain of another root, block size or token array is
// dropped first (scheduler.BlockKeyChain).
func (m *Manager) promptKey(r *scheduler.Request, root scheduler.BlockKey, k int) scheduler.BlockKey {
	c := m.keyChain(r, root)
	m.growChain(c, r, root, k)
	return c.Keys[k]
}

// keyChain returns r's key chain for root, dropped first when it belongs to
// another root, block size or token array.
func (m *Manager) keyChain(r *scheduler.Request, root scheduler.BlockKey) *scheduler.BlockKeyChain {
	c := &r.KeyChain
	var first *int32
	if len(r.Tokens) > 0 {
		first = &r.Tokens[0]
	}
	if c.Block != m.lb || c.Tokens != first || c.Root != root {
		c.Root, c.Block, c.Tokens, c.Keys = root, m.lb, first, c.Keys[:0]
	}
	return c
}

// growChain hashes c (r's chain for root, from keyChain) up to block k.
func (m *Manager) growChain(c *scheduler.BlockKeyChain, r *scheduler.Request, root scheduler.BlockKey, k int) {
	if len(c.Keys) > k {
		return
	}
	if cap(c.Keys) <= k {
		// Room for every full block of the prompt at once: a long prompt's
		// chain is not copied through doublings as it grows.
		c.Keys = append(make([]scheduler.BlockKey, 0, max(k+1, min(r.PromptLen, len(r.Tokens))/m.lb)), c.Keys...)
	}
	for len(c.Keys) <= k {
		i := len(c.Keys)
		parent := root
		if i > 0 {
			parent = c.Keys[i-1]
		}
		c.Keys = append(c.Keys, m.hasher.key(parent, r.Tokens[i*m.lb:(i+1)*m.lb]))
	}
}

// commit publishes every newly full block of the first n prompt tokens
// (§5.4). A block that cannot be inserted ends committing ("virtual stop").
func (m *Manager) commit(s *sequence, r *scheduler.Request, n int) {
	for !s.stopped && (s.committed/m.lb+1)*m.lb <= n {
		k := s.committed / m.lb
		if !m.commitBlock(s, r, k, m.lb) {
			s.stopped = true
			return
		}
		s.committed = (k + 1) * m.lb
	}
}

// stopCommitting commits the prompt's partial tail block, if any, and ends
// committing (§5.4). The full blocks were committed first.
func (m *Manager) stopCommitting(s *sequence, r *scheduler.Request) {
	if s.stopped {
		return
	}
	end := r.PromptLen
	if k := s.committed / m.lb; s.committed < end && end < (k+1)*m.lb {
		if m.commitBlock(s, r, k, end-k*m.lb) {
			s.committed = end
		}
	}
	s.stopped = true
}

// commitBlock publishes block k of s holding length prompt tokens (§6.5).
// It returns false when the block cannot be inserted (virtual stop).
func (m *Manager) commitBlock(s *sequence, r *scheduler.Request, k, length int) bool {
	if s.status != SeqActive {
		panic(fmt.Sprintf("kvpool: invariant commit-requires-active: request %d is %s", s.id, s.status))
	}
	parent := s.root
	if k > 0 {
		parent = s.blocks[k-1].n
	}
	cur := s.blocks[k]
	if parent == nil || !parent.inTree || cur.n != nil {
		return false
	}
	tokens := r.Tokens[k*m.lb : k*m.lb+length]
	var key scheduler.BlockKey
	if length == m.lb {
		key = m.keyAt(s, r, k)
	} else {
		key = m.hasher.key(parent.key, tokens)
	}
	if ex := m.nodes[nodeIndex(key)]; ex != nil {
		if ex.key != key || ex.parent != parent || !slices.Equal(ex.tokens, tokens) {
			return false // another block's lookup key collides: not inserted
		}
		if length != m.lb || len(ex.tokens) != m.lb || ex.loc.tier != TierGPU {
			return false // an identical partial block covers it, or the block is on the host
		}
		// Rebase: lock the existing block's page, drop the private one.
		m.addRef(ex.loc, true)
		m.dropRef(cur.loc, true)
		s.blocks[k] = blockRef{n: ex}
		s.table[k] = ex.loc.page
		return true
	}
	if length < m.lb || parent.partialChildren > 0 {
		var replaced []*node
		for _, c := range parent.children {
			if len(c.tokens) >= length && commonPrefix(c.tokens, tokens) == length {
				return false // a sibling covers the new block
			}
			if len(c.tokens) < m.lb && commonPrefix(c.tokens, tokens) == len(c.tokens) {
				replaced = append(replaced, c)
			}
		}
		for _, c := range replaced {
			m.detach(c)
		}
	}
	n := m.insert(parent, key, tokens, cur.loc)
	s.blocks[k] = blockRef{n: n}
	s.inserted = append(s.inserted, n)
	return true
}

// conversation is a PER_CONVERSATION conversation's state (§7).
type conversation struct {
	current    uint64
	hasCurrent bool
	// plans are the drop plans of the last turns, oldest first.
	plans [][]*node
}

// maxNumTurns is the configured drop-plan depth.
func (m *Manager) maxNumTurns() int { return max(1, m.cfg.MaxNumTurns) }

// registerConversation makes r its conversation's current request on its
// first chunk; a second concurrent request of the conversation ignores its
// conversation parameters (behaves as PER_REQUEST) with one warning.
func (m *Manager) registerConversation(s *sequence, r *scheduler.Request) {
	if !m.cfg.EnableBlockReuse || m.cfg.ReusePolicy != scheduler.PerConversation || r.ConversationID == "" {
		return
	}
	c := m.convs[r.ConversationID]
	if c == nil {
		c = &conversation{}
		m.convs[r.ConversationID] = c
	}
	if c.hasCurrent {
		m.notes = append(m.notes, fmt.Sprintf(
			"Conversation %s already has current request %d. Request %d will ignore conversation params.",
			r.ConversationID, c.current, r.ID))
		return
	}
	c.current, c.hasCurrent = r.ID, true
	s.conv = r.ConversationID
}

// endConversationTurn runs when a registered request's cache closes: the
// current-request slot is released (also on cancellation), and a request
// whose prompt completed records its plan, the blocks it inserted beyond
// the prefix it reused. Beyond MaxNumTurns plans, the oldest plan's blocks
// are dropped with their subtrees (§6.6).
func (m *Manager) endConversationTurn(s *sequence) {
	if s.conv == "" {
		return
	}
	c := m.convs[s.conv]
	c.hasCurrent = false
	if s.contextDone {
		c.plans = append(c.plans, slices.Clone(s.inserted))
		for len(c.plans) > m.maxNumTurns() {
			for _, n := range c.plans[0] {
				if n.inTree {
					m.dropSubtree(n) // skipped while some block below is in use
				}
			}
			c.plans[0] = nil
			c.plans = c.plans[1:]
		}
	}
	s.conv = ""
}
