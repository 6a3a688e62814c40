package kvpool

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// This file holds the scheduler.KVManager side of the Manager
// (scheduler.md §17, kvcache.md §8). Requests are identified by r.ID.

// PrepareContext creates r's cache if it has none and resumes it. Without
// prefix reuse a new cache starts empty and r.ContextPosition is unchanged.
// It fails only after Close (no page-table row limit exists in this cut).
func (m *Manager) PrepareContext(r *scheduler.Request) bool {
	s, ok := m.seqs[r.ID]
	if !ok {
		if m.closed {
			return false
		}
		s = m.create(r.ID)
	}
	m.resume(s)
	return true
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
// unreserved (counting pages r already holds), reserve them, then
// ResizeContext(r, n). On false nothing changed; in particular a cache this
// call had to create is closed again. Normally PrepareContext ran first.
func (m *Manager) PrepareBlocksIfSchedulable(r *scheduler.Request, n int) bool {
	s, existed := m.seqs[r.ID]
	if !existed {
		if m.closed {
			return false
		}
		s = m.create(r.ID)
	}
	wasSuspended := s.status == SeqSuspended
	undo := func() bool {
		if !existed {
			m.closeSeq(s)
		} else if wasSuspended {
			m.suspend(s)
		}
		return false
	}
	target := max(s.reserveTarget, m.PagesToCompletion(r))
	grow := max(0, target-len(s.pages)) - s.reservation()
	if grow > m.pool.numFree()-m.reserved {
		return undo()
	}
	m.resume(s)
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

// ReleaseContextAdmission undoes a first-chunk admission that did not end
// SCHEDULED: closes r's cache (releasing pages and reservation) and rewinds
// r.ContextPosition to 0, so that a retry cannot keep a prefix it no longer
// holds.
func (m *Manager) ReleaseContextAdmission(r *scheduler.Request) {
	if s, ok := m.seqs[r.ID]; ok {
		m.closeSeq(s)
	}
	r.ContextPosition = 0
}

// TryAllocateGeneration resumes r's cache if it is suspended, then grows its
// capacity by one token and records the growth for RevertAllocateGeneration.
// On false nothing changed (a cache resumed by this call is suspended again).
// A request without a cache gets false.
func (m *Manager) TryAllocateGeneration(r *scheduler.Request) bool {
	s, ok := m.seqs[r.ID]
	if !ok {
		return false
	}
	resumed := s.status == SeqSuspended
	m.resume(s)
	if !m.resize(s, s.capacity+1) {
		if resumed {
			m.suspend(s)
		}
		return false
	}
	s.growthRecorded = true
	return true
}

// RevertAllocateGeneration undoes the last recorded generation growth
// (capacity − 1, releasing the tail page if it empties) and clears the
// record; without a record it does nothing, so a second revert is a no-op.
// The shrink cannot fail; if history already covers the token it panics.
func (m *Manager) RevertAllocateGeneration(r *scheduler.Request) {
	s, ok := m.seqs[r.ID]
	if !ok || !s.growthRecorded {
		return
	}
	s.growthRecorded = false
	if s.status == SeqSuspended {
		// Shrinking needs locks; a suspend between growth and revert is
		// unusual but harmless to undo in place.
		m.resume(s)
		defer m.suspend(s)
	}
	m.resize(s, s.capacity-1)
}

// Suspend suspends r's cache. Without a host tier its pages stay held on the
// device; only the status changes. No-op without an active cache.
func (m *Manager) Suspend(r *scheduler.Request) {
	if s, ok := m.seqs[r.ID]; ok {
		m.suspend(s)
	}
}

// Free closes r's cache, releasing its pages and its reservation. Idempotent.
func (m *Manager) Free(r *scheduler.Request) {
	if s, ok := m.seqs[r.ID]; ok {
		m.closeSeq(s)
	}
}

// IsActive reports whether id has an ACTIVE cache.
func (m *Manager) IsActive(id uint64) bool {
	s, ok := m.seqs[id]
	return ok && s.status == SeqActive
}

// HasCache reports whether id has a cache (active or suspended).
func (m *Manager) HasCache(id uint64) bool {
	_, ok := m.seqs[id]
	return ok
}

// HasHostTier is false: this cut has no host tier, so suspension frees no
// device page.
func (m *Manager) HasHostTier() bool { return false }

// BlockReuseEnabled is false: this cut has no radix prefix reuse.
func (m *Manager) BlockReuseEnabled() bool { return false }

// ReusePolicy is PerRequest: with reuse off nothing is ever committed and
// history follows the context position, which is PER_REQUEST's prefill
// behaviour (and the scheduler harness's convention for a reuse-less
// manager). The prefix-aware skip stays off either way.
func (m *Manager) ReusePolicy() scheduler.ReusePolicy { return scheduler.PerRequest }

// ProbeFirstNewBlockKey reports no key: without reuse no block is ever on
// the device, and the prefix-aware skip must never defer.
func (m *Manager) ProbeFirstNewBlockKey(*scheduler.Request) (scheduler.BlockKey, bool) {
	return scheduler.BlockKey{}, false
}

// mustSeq returns id's sequence or panics naming the operation: the
// scheduler only resizes caches it has just prepared.
func (m *Manager) mustSeq(op string, id uint64) *sequence {
	s, ok := m.seqs[id]
	if !ok {
		panic(fmt.Sprintf("kvpool: %s of request %d: no cache (PrepareContext first)", op, id))
	}
	return s
}
