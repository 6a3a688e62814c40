package kvpool

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// This file holds the scheduler.KVManager side of the Manager
// (scheduler.md §17, kvcache.md §8). Requests are identified by r.ID.

// PrepareContext creates r's cache if it has none and resumes it. Creation
// (first chunk) takes a free page-table row, matches r's lookup tokens
// against the radix tree and claims the reusable prefix: r.ContextPosition
// = m, so Remaining shrinks and the reused tokens skip prefill. It returns
// false when no row is free (nothing created) or the resume is refused (the
// created cache is kept, suspended; a later pass retries).
func (m *Manager) PrepareContext(r *scheduler.Request) bool {
	s, ok := m.seq(r.ID)
	if !ok {
		if m.closed {
			return false
		}
		if s = m.create(r.ID, false); s == nil {
			return false
		}
		m.hintBlocks(s, r)
		m.claimPrefix(s, r, true)
		m.registerConversation(s, r)
		if m.cfg.CP > 1 && r.TotalInputLenCP == 0 {
			r.TotalInputLenCP = r.PromptLen
		}
	}
	return m.resume(s)
}

// ProbeReuse is the match of §6.3 for r's lookup tokens, in tokens, without
// taking anything (advisory: the tree may change before PrepareContext).
func (m *Manager) ProbeReuse(r *scheduler.Request) int {
	if !m.cfg.EnableBlockReuse {
		return 0
	}
	return m.match(r).tokens(m.lb)
}

// ResizeContext makes capacity = max(capacity, r.ContextPosition+n),
// allocating pages all-or-nothing; false leaves everything unchanged.
// Preconditions (panics otherwise): r has an ACTIVE cache (PrepareContext
// ran), n ≥ 0.
func (m *Manager) ResizeContext(r *scheduler.Request, n int) bool {
	s := m.mustSeq("ResizeContext", r.ID)
	if n < 0 {
		panic(fmt.Sprintf("kvpool: ResizeContext of request %d with n = %d < 0", r.ID, n))
	}
	return m.resize(s, max(s.capacity, r.ContextPosition+n))
}

// PrepareBlocksIfSchedulable is the GUARANTEED_NO_EVICT first-chunk
// admission (scheduler.md §14.2): if PagesToCompletion(r) pages are still
// unreserved (free + cached − reserved, counting pages r already holds),
// reserve them, then ResizeContext(r, n). On false nothing changed; a cache
// this call had to create is closed again and r.ContextPosition restored.
// Normally PrepareContext ran first.
func (m *Manager) PrepareBlocksIfSchedulable(r *scheduler.Request, n int) bool {
	s, existed := m.seq(r.ID)
	oldPos := r.ContextPosition
	if !existed {
		if m.closed {
			return false
		}
		if s = m.create(r.ID, false); s == nil {
			return false
		}
		m.hintBlocks(s, r)
		m.claimPrefix(s, r, false)
		m.registerConversation(s, r)
	}
	wasSuspended, at := s.status == SeqSuspended, s.suspendedAt
	undo := func() bool {
		if !existed {
			m.closeSeq(s)
			r.ContextPosition = oldPos
		} else if wasSuspended && s.status == SeqActive {
			m.suspend(s)
			s.suspendedAt = at
		}
		return false
	}
	target := max(s.reserveTarget, m.PagesToCompletion(r))
	grow := max(0, target-len(s.blocks)) - s.reservation()
	if grow+m.resumePages(s) > m.gpu.numFree()+m.numCached-m.reserved {
		return undo()
	}
	if !m.resume(s) {
		return undo()
	}
	oldTarget := s.reserveTarget
	m.reserved += grow
	s.reserveTarget = target
	if !m.ResizeContext(r, n) {
		m.reserved -= grow
		s.reserveTarget = oldTarget
		return undo()
	}
	return true
}

// resumePages is how many GPU pages resuming s allocates: one per host page
// and one for a copy-on-resume partial block.
func (m *Manager) resumePages(s *sequence) int {
	if s.status == SeqActive {
		return 0
	}
	n := 0
	for _, b := range s.blocks {
		if b.where().tier == TierHost {
			n++
		}
	}
	// A partial block s alone holds is adopted instead of copied when pages
	// are short (adoptPartial), so it needs no page of its own.
	if k := len(s.blocks) - 1; s.partialPending && s.blocks[k].where().tier == TierGPU && !m.adoptable(s, k) {
		n++
	}
	return n
}

// ReleaseContextAdmission undoes a first-chunk admission that did not end
// SCHEDULED: closes r's cache (releasing pages, reservation and row) and
// rewinds r.ContextPosition to 0, so that a retry cannot keep a prefix it
// no longer holds (the retry matches again).
//
// Deliberate difference (issue 24): the cached blocks the admission claimed
// become cached again with the LRU stamps they had, as if never claimed; a
// failed admission used none of them. Before, each failed attempt stamped
// them as just used, so a request waiting on a full pool kept its prefix
// young at every pass; vLLM, too, touches reused blocks only once the
// allocation succeeded. It also makes a failed admission leave no trace,
// which lets the scheduler skip one it knows will fail (FirstChunkBlocked).
func (m *Manager) ReleaseContextAdmission(r *scheduler.Request) {
	if s, ok := m.seq(r.ID); ok {
		stamps := append(m.stampScratch[:0], s.claimStamps...) // closeSeq clears the sequence's
		m.closeSeq(s)
		for _, st := range stamps {
			if st.n.cached {
				st.n.lastUse = st.lastUse
				m.leaves.fix(st.n)
			}
		}
		clear(stamps)
		m.stampScratch = stamps[:0]
	}
	r.ContextPosition = 0
}

// TryAllocateGeneration resumes r's cache if it is suspended, then grows its
// capacity by one token and records the growth for RevertAllocateGeneration.
// Under Helix it first derives r.SeqLenThisRankCP and r.InactiveRank for
// position TotalInputLenCP + g (§10.5) and, on success, g += 1
// (r.HelixDecodeCount mirrors g). On false nothing changed (a cache resumed
// by this call is suspended again). A request without a cache gets false.
func (m *Manager) TryAllocateGeneration(r *scheduler.Request) bool {
	s, ok := m.seq(r.ID)
	if !ok {
		return false
	}
	resumed, at := s.status == SeqSuspended, s.suspendedAt
	if !m.resume(s) {
		return false
	}
	helix := m.cfg.CP > 1 && !s.dummy
	if helix {
		r.SeqLenThisRankCP, r.InactiveRank = HelixDecodeFields(helixT(r), s.g, m.cfg.CPRank, m.cfg.TokensPerPage, m.cfg.CP)
	}
	if !m.resize(s, s.capacity+1) {
		if resumed {
			m.suspend(s)
			s.suspendedAt = at // a failed attempt is not a new suspension
		}
		return false
	}
	s.growthRecorded = true
	if helix {
		s.g++
		r.HelixDecodeCount = s.g
	}
	return true
}

// RevertAllocateGeneration undoes the last recorded generation growth
// (capacity − 1, releasing the tail page if it empties; Helix: g −= 1, not
// below 0) and clears the record; without a record it does nothing, so a
// second revert is a no-op. The shrink cannot fail; if history already
// covers the token it panics.
func (m *Manager) RevertAllocateGeneration(r *scheduler.Request) {
	s, ok := m.seq(r.ID)
	if !ok || !s.growthRecorded {
		return
	}
	s.growthRecorded = false
	if m.cfg.CP > 1 && !s.dummy && s.g > 0 {
		s.g--
		r.HelixDecodeCount = s.g
	}
	if s.status == SeqSuspended {
		// Shrinking needs locks; a suspend between growth and revert is
		// unusual but harmless to undo in place (all pages stay where they
		// are: a shrink allocates nothing).
		at := s.suspendedAt
		m.resumeInPlace(s)
		defer func() { m.suspend(s); s.suspendedAt = at }()
	}
	m.resize(s, s.capacity-1)
}

// resumeInPlace turns holds into locks without moving pages, for a shrink
// of a suspended sequence. Blocks on the host stay there; the shrink only
// releases the tail block.
func (m *Manager) resumeInPlace(s *sequence) {
	for _, b := range s.blocks {
		m.holdToLock(b.where())
	}
	s.status = SeqActive
}

// Suspend suspends r's cache: locks become holds. With a host tier its
// pages may then migrate to the host under GPU pressure; without one they
// stay held on the device. No-op without an active cache.
func (m *Manager) Suspend(r *scheduler.Request) {
	if s, ok := m.seq(r.ID); ok {
		m.suspend(s)
	}
}

// Free closes r's cache, releasing its pages, its reservation and its row.
// Committed blocks nobody else uses become cached. Idempotent.
func (m *Manager) Free(r *scheduler.Request) {
	if s, ok := m.seq(r.ID); ok {
		m.closeSeq(s)
	}
}

// IsActive reports whether id has an ACTIVE cache.
func (m *Manager) IsActive(id uint64) bool {
	s, ok := m.seq(id)
	return ok && s.status == SeqActive
}

// HasCache reports whether id has a cache (active or suspended).
func (m *Manager) HasCache(id uint64) bool {
	_, ok := m.seq(id)
	return ok
}

// HoldsDevicePages reports whether id's cache has at least one page on the
// device (GPU tier). Without a host tier every page of a cache is on the
// device; with one, a suspended cache's pages may all have migrated.
func (m *Manager) HoldsDevicePages(id uint64) bool {
	s, ok := m.seq(id)
	if !ok {
		return false
	}
	for _, b := range s.blocks {
		if b.where().tier == TierGPU {
			return true
		}
	}
	return false
}

// HasHostTier reports whether a host tier exists (HostPages > 0): only then
// does suspension free device pages.
func (m *Manager) HasHostTier() bool { return m.host.numPages() > 0 }

// BlockReuseEnabled reports whether radix prefix reuse is on.
func (m *Manager) BlockReuseEnabled() bool { return m.cfg.EnableBlockReuse }

// ReusePolicy is the configured policy with reuse on. With reuse off it is
// PerRequest: nothing is ever committed and history follows the context
// position, and the prefix-aware skip stays off.
func (m *Manager) ReusePolicy() scheduler.ReusePolicy {
	if !m.cfg.EnableBlockReuse {
		return scheduler.PerRequest
	}
	return m.cfg.ReusePolicy
}

// ProbeFirstNewBlockKey returns the key of the first full block of r's
// lookup tokens, at or after the block holding r.ContextPosition, that is
// not present on the GPU; false when the lookup tokens have no such full
// block, or reuse is off (scheduler.md §8). No state changes (a key cache
// of r's own cache may grow).
func (m *Manager) ProbeFirstNewBlockKey(r *scheduler.Request) (scheduler.BlockKey, bool) {
	if !m.cfg.EnableBlockReuse {
		return scheduler.BlockKey{}, false
	}
	lookup := min(len(r.Tokens), r.PromptLen) - 1
	s, _ := m.seq(r.ID)
	if s == nil && r.ContextPosition == 0 && lookup > 0 {
		// From the first block the probe is match's first new block
		// (match stops at the same block), kept with r's match.
		km := m.cachedMatch(r)
		return km.firstNew, km.hasNew
	}
	var rootKey scheduler.BlockKey
	if s != nil && s.root != nil {
		rootKey = s.root.key
	} else if root := m.rootFor(m.saltOf(r), false); root != nil {
		rootKey = root.key
	} else {
		rootKey = LookupRootKey(m.saltOf(r))
	}
	for k := r.ContextPosition / m.lb; (k+1)*m.lb <= lookup; k++ {
		key := m.promptKey(r, rootKey, k)
		// A lookup key names its whole prefix only with the re-check of
		// every block above it (lookupChild); this probe checks the block's
		// tokens: a collision here can only name a block as present.
		if b := m.nodes[nodeIndex(key)]; b == nil || b.key != key || b.loc.tier != TierGPU || !slices.Equal(b.tokens, r.Tokens[k*m.lb:(k+1)*m.lb]) {
			return key, true
		}
	}
	return scheduler.BlockKey{}, false
}

// FirstChunkBlocked reports that r's first chunk, of chunk(matched)
// tokens once the reusable prefix of matched tokens is claimed, cannot be
// allocated now under MAX_UTILIZATION, and that the failed admission would
// leave the pool exactly as it is (scheduler.KVManager). A chunk of 0
// tokens is one the scheduler would skip after the admission. It is exact,
// not a heuristic: true only when
//   - r has no cache, the manager is open, nothing is reserved, there is no
//     host tier (no page can migrate) and reuse is not PER_CONVERSATION
//     (whose admission registers the conversation and may note it);
//   - a partial block in the match comes with no page free or cached (else
//     the admission's resume would copy it into a page of its own first);
//   - the pages the chunk needs past the matched prefix (its full blocks
//     and partial block) exceed the free and cached pages. Claiming cached
//     blocks of the prefix only lowers what is left, and a claim that stops
//     early (no page left to claim a cached block with) leaves none for a
//     chunk, which needs at least one new page then, so the allocation
//     fails whatever the claim takes; the released admission restores the
//     claimed blocks' LRU stamps (ReleaseContextAdmission), so the attempt
//     would leave no trace.
//
// The match is r's last one while it still holds (matchMemo), so a request
// waiting through many passes is matched again only when the tree changed
// where its match ends.
func (m *Manager) FirstChunkBlocked(r *scheduler.Request, chunk func(r *scheduler.Request, matched int) int) bool {
	if m.closed || m.reserved != 0 || m.host.numPages() > 0 {
		return false
	}
	if _, ok := m.seq(r.ID); ok {
		return false
	}
	if m.cfg.EnableBlockReuse && m.cfg.ReusePolicy == scheduler.PerConversation {
		return false
	}
	slack := m.gpu.numFree() + m.numCached
	full, q := 0, 0
	if m.cfg.EnableBlockReuse && r.ContextPosition == 0 {
		km := m.cachedMatch(r)
		full, q = km.full, km.q
	}
	if q > 0 && slack > 0 {
		// Resuming the admission copies the shared partial block into a
		// page of its own (copy-on-resume, evicting for it if need be) before
		// the chunk's allocation is tried: a trace even when that fails.
		return false
	}
	matched := full*m.lb + q
	blocks := full
	if q > 0 {
		blocks++
	}
	n := chunk(r, matched)
	if n <= 0 {
		return true // skipped after the admission, which leaves no trace
	}
	capacity := r.ContextPosition + matched + n
	if m.maxCapacity > 0 && capacity > m.maxCapacity {
		return true // resize refuses any capacity beyond the maximum
	}
	return ceilDiv(capacity, m.lb)-blocks > slack
}

// NoFirstChunkFits reports that no page can be had at all (none free or
// cached, no host tier to migrate to, nothing reserved), under the
// conditions of FirstChunkBlocked on the manager: then every first chunk
// fails, and leaves no trace. A chunk needs at least one page past its
// matched prefix unless the match ends in a partial block; resuming such a
// match first copies the partial block, which needs a page, and fails (an
// adoptable partial block is a cached one, and none is cached).
func (m *Manager) NoFirstChunkFits() bool {
	if m.closed || m.reserved != 0 || m.host.numPages() > 0 {
		return false
	}
	if m.cfg.EnableBlockReuse && m.cfg.ReusePolicy == scheduler.PerConversation {
		return false
	}
	return m.gpu.numFree() == 0 && m.numCached == 0
}

// matchMemo is a request's last match (kept in BlockKeyChain.Memo), so that
// a request waiting through many passes is matched again only when the
// tree changed where its match ends. It holds while last, the deepest
// matched node (its root when no block matched), is in the tree with the
// same children: a match extends only by a child of last (its first new
// block inserted, or a partial block beside it), and a removal of any
// matched block removes last first (only leaves are evicted; a dropped
// subtree goes whole). Blocks move between tiers only with a host tier,
// which turns the memo off.
type matchMemo struct {
	by     *Manager
	tokens *int32
	lb     int
	gen    uint64 // last.childGen at the match
	keptMatch
}

// keptMatch is the outcome of match without the list of full blocks: they
// are last and its ancestors below the root (fullBlocks).
type keptMatch struct {
	last     *node // the deepest full block matched, or the root; nil without a root
	full     int   // full blocks matched
	partial  *node // the partially matched child of last, or nil
	q        int   // tokens matched in partial
	firstNew scheduler.BlockKey
	hasNew   bool
}

// cachedMatch is match(r) from r's memo when it still holds, or matched
// afresh (and remembered).
func (m *Manager) cachedMatch(r *scheduler.Request) keptMatch {
	var first *int32
	if len(r.Tokens) > 0 {
		first = &r.Tokens[0]
	}
	memo, _ := r.KeyChain.Memo.(*matchMemo)
	if memo != nil && memo.by == m && memo.tokens == first && memo.lb == m.lb && memo.last.inTree &&
		m.host.numPages() == 0 {
		if memo.last.childGen == memo.gen {
			return memo.keptMatch
		}
		// last's children changed. Unless its first new block arrived (the
		// full match extends: match again), only the partial step can
		// differ: redo it alone.
		if b := m.nodes[nodeIndex(memo.firstNew)]; !memo.hasNew || b == nil || b.key != memo.firstNew || b.loc.tier != TierGPU || len(b.tokens) != m.lb {
			lookup := r.Tokens[:max(0, min(len(r.Tokens), r.PromptLen)-1)]
			memo.partial, memo.q = nil, 0
			if len(lookup) > 0 {
				memo.partial, memo.q = m.partialMatch(lookup, memo.last, memo.full)
			}
			memo.gen = memo.last.childGen
			return memo.keptMatch
		}
	}
	res := m.match(r)
	km := keptMatch{last: res.root, full: len(res.full), partial: res.partial, q: res.q, firstNew: res.firstNew,
		hasNew: res.hasNew}
	if km.full > 0 {
		km.last = res.full[km.full-1]
	}
	clear(res.full) // scratch: no evicted node stays reachable through it
	m.fullScratch = res.full[:0]
	if km.last == nil || m.host.numPages() > 0 {
		return km
	}
	if memo == nil {
		memo = new(matchMemo)
		r.KeyChain.Memo = memo
	}
	*memo = matchMemo{by: m, tokens: first, lb: m.lb, gen: km.last.childGen, keptMatch: km}
	return km
}

// fullBlocks lists km's full blocks, root side first, in a scratch slice of
// the manager (valid until the next match): last and its ancestors.
func (m *Manager) fullBlocks(km keptMatch) []*node {
	full := m.fullScratch[:0]
	for range km.full {
		full = append(full, nil)
	}
	n := km.last
	for i := km.full - 1; i >= 0; i-- {
		full[i] = n
		n = n.parent
	}
	m.fullScratch = full
	return full
}

// mustSeq returns id's sequence or panics naming the operation: the
// scheduler only resizes caches it has just prepared.
func (m *Manager) mustSeq(op string, id uint64) *sequence {
	s, ok := m.seq(id)
	if !ok {
		panic(fmt.Sprintf("kvpool: %s of request %d: no cache (PrepareContext first)", op, id))
	}
	return s
}

// ObtainablePages is the number of GPU pages (ledger blocks) an allocation
// could obtain now: free, cached (evictable) and migratable to the host
// tier, less the pages reserved (scheduler.PageCounter, read by the
// MAX_UTILIZATION admission watermark).
func (m *Manager) ObtainablePages() int { return m.obtainable() - m.reserved }
