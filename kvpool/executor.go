package kvpool

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// This file holds the executor-facing side of the Manager (kvcache.md §8):
// block tables for the step descriptor, dummies, history bookkeeping after a
// step, and capacity queries.

// BlockTable returns id's page indices in token order (page k holds tokens
// [k·P, (k+1)·P)), or nil without a cache. The slice is a view of the
// manager's own storage: it is valid until the next mutating call on the
// manager and must not be modified or retained; copy it to keep it.
func (m *Manager) BlockTable(id uint64) []int32 {
	s, ok := m.seqs[id]
	if !ok {
		return nil
	}
	return s.pages
}

// Capacity is id's capacity in tokens (0 without a cache).
func (m *Manager) Capacity(id uint64) int {
	if s, ok := m.seqs[id]; ok {
		return s.capacity
	}
	return 0
}

// AddDummy creates an ACTIVE padding sequence for r (executor.md §4.2) with
// capacity tokens. It fails, changing nothing, when r already has a cache,
// after Close, or when the pages are not available (reservations of admitted
// requests are respected).
func (m *Manager) AddDummy(r *scheduler.Request, tokens int) bool {
	if _, ok := m.seqs[r.ID]; ok || m.closed || tokens < 0 {
		return false
	}
	s := m.create(r.ID)
	s.dummy = true
	m.resume(s)
	if !m.resize(s, tokens) {
		m.closeSeq(s)
		return false
	}
	return true
}

// AvailableTokens is (free − reserved pages)·P, capped by MaxSeqLen when one
// is configured: how many tokens a new, unreserved allocation could get.
func (m *Manager) AvailableTokens() int {
	t := (m.pool.numFree() - m.reserved) * m.cfg.TokensPerPage
	if m.cfg.MaxSeqLen > 0 {
		t = min(t, m.cfg.MaxSeqLen)
	}
	return t
}

// PagesToCompletion is ceil((PromptLen + MaxNewTokens)/P): the pages r could
// ever need, ignoring prefix sharing (scheduler.md §14.2).
func (m *Manager) PagesToCompletion(r *scheduler.Request) int {
	return ceilDiv(max(0, r.PromptLen+r.MaxNewTokens), m.cfg.TokensPerPage)
}

// UpdateAfterContext records that r's context chunk ran: the executor has
// advanced r.ContextPosition past the chunk, and those tokens are final, so
// history = ContextPosition. Without reuse nothing is committed. No-op
// without a cache; a position beyond capacity panics.
func (m *Manager) UpdateAfterContext(r *scheduler.Request) {
	if s, ok := m.seqs[r.ID]; ok {
		m.setHistory(s, r.ContextPosition)
	}
}

// UpdateAfterGeneration records that r's generation step ran, after the
// executor appended its token: history = PromptLen + Generated − 1 (every
// token but the newest is final; kvcache.md §8, non-Helix), capacity
// unchanged. The growth record is cleared: the step is final and can no
// longer be reverted. History never decreases; one beyond capacity panics.
func (m *Manager) UpdateAfterGeneration(r *scheduler.Request) {
	s, ok := m.seqs[r.ID]
	if !ok {
		return
	}
	s.growthRecorded = false
	m.setHistory(s, r.PromptLen+r.Generated-1)
}

// sortedIDs lists the open sequences' ids in increasing order, for the
// operations that must visit all of them deterministically.
func (m *Manager) sortedIDs() []uint64 {
	ids := make([]uint64, 0, len(m.seqs))
	for id := range m.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// String summarises the pool for logs.
func (m *Manager) String() string {
	return fmt.Sprintf("kvpool{pages %d, free %d, reserved %d, sequences %d, P %d}",
		m.pool.numPages(), m.pool.numFree(), m.reserved, len(m.seqs), m.cfg.TokensPerPage)
}
