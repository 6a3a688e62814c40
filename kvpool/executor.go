package kvpool

import (
	"github.com/lockstep-ai/lockstep/scheduler"
)

// This file holds the executor-facing side of the Manager (kvcache.md §8):
// block tables and rows for the step descriptor, dummies, bookkeeping after
// a step (commits for prefix reuse), capacity queries and reuse counters.

// BlockTable returns id's GPU page indices in ledger-block order (page k
// holds tokens [k·B, (k+1)·B) of the ledger, B = LedgerBlockTokens), or nil
// without a cache. It is exact while the cache is ACTIVE (the executor only
// reads scheduled, hence active, requests). The slice is a view of the
// manager's storage: valid until the next mutating call; copy to keep it.
func (m *Manager) BlockTable(id uint64) []int32 {
	s, ok := m.seq(id)
	if !ok {
		return nil
	}
	return s.table
}

// Row is id's page-table row index (§4.3), or −1 without a cache. Rows are
// handed out lowest first when a cache is created and released on close.
func (m *Manager) Row(id uint64) int {
	if s, ok := m.seq(id); ok {
		return s.row
	}
	return -1
}

// Capacity is id's capacity in tokens (0 without a cache).
func (m *Manager) Capacity(id uint64) int {
	if s, ok := m.seq(id); ok {
		return s.capacity
	}
	return 0
}

// AddDummy creates an ACTIVE padding sequence for r (executor.md §4.2) with
// capacity tokens. Under Helix (§10.8) tokens is token_num (≥ 2): the
// capacity is token_num·cp global tokens and r gets the frozen fields
// (TotalInputLenCP = token_num·cp − 1, SeqLenThisRankCP and InactiveRank of
// HelixDummyFields); g is never touched for a dummy. It fails, changing
// nothing, when r already has a cache, after Close, without a free row, or
// when the pages are not available (reservations are respected).
func (m *Manager) AddDummy(r *scheduler.Request, tokens int) bool {
	if _, ok := m.seq(r.ID); ok || m.closed || tokens < 0 {
		return false
	}
	capacity := tokens
	if m.cfg.CP > 1 {
		if tokens < 2 {
			return false
		}
		capacity = tokens * m.cfg.CP
	}
	s := m.create(r.ID, true)
	if s == nil {
		return false
	}
	s.stopped = true
	m.resume(s)
	if !m.resize(s, capacity) {
		m.closeSeq(s)
		return false
	}
	if m.cfg.CP > 1 {
		_, r.SeqLenThisRankCP, r.InactiveRank, r.TotalInputLenCP = HelixDummyFields(tokens, m.cfg.CPRank, m.cfg.CP)
	}
	return true
}

// AvailableTokens is (free + cached − reserved pages)·ledger block, capped
// by MaxSeqLen when one is configured: how many tokens a new, unreserved
// allocation could get. Cached pages count: they are dropped on demand.
func (m *Manager) AvailableTokens() int {
	t := (m.gpu.numFree() + m.numCached - m.reserved) * m.lb
	if m.cfg.MaxSeqLen > 0 {
		t = min(t, m.cfg.MaxSeqLen)
	}
	return max(0, t)
}

// PagesToCompletion is ceil((PromptLen + MaxNewTokens)/ledger block): the
// pages r could ever need, ignoring prefix sharing (scheduler.md §14.2).
func (m *Manager) PagesToCompletion(r *scheduler.Request) int {
	return ceilDiv(max(0, r.PromptLen+r.MaxNewTokens), m.lb)
}

// UpdateAfterContext records that r's context chunk ran; the executor has
// advanced r.ContextPosition past it. Per the reuse policy (§7) it commits
// blocks into the radix tree: ALL_REUSABLE every newly full block; every
// policy, at the end of the prompt, the remaining blocks and the partial
// tail, then stops committing. History = ContextPosition (tokens before it
// are final). Under Helix SeqLenThisRankCP = local_len(ContextPosition) and
// InactiveRank = false (§10.6). The first call for a cache counts its
// admission in PrefixStats. No-op without a cache; a position beyond
// capacity panics.
func (m *Manager) UpdateAfterContext(r *scheduler.Request) {
	s, ok := m.seq(r.ID)
	if !ok {
		return
	}
	if !s.counted && !s.dummy {
		s.counted = true
		m.stats.Admissions++
		m.stats.PromptTokens += int64(r.PromptLen)
		m.stats.ReusedTokens += int64(s.reusedTokens)
	}
	pos := r.ContextPosition
	if m.cfg.CP > 1 {
		r.SeqLenThisRankCP = HelixLocalLen(pos, m.cfg.CPRank, m.cfg.TokensPerPage, m.cfg.CP)
		r.InactiveRank = false
	}
	if !s.stopped && s.status == SeqActive {
		if m.cfg.ReusePolicy == scheduler.AllReusable {
			m.commit(s, r, min(pos, r.PromptLen))
		}
		if pos >= r.PromptLen {
			m.commit(s, r, r.PromptLen)
			m.stopCommitting(s, r)
		}
	}
	if pos >= r.PromptLen {
		s.contextDone = true
	}
	m.setHistory(s, pos)
}

// UpdateAfterGeneration records that r's generation step ran, after the
// executor appended its token: non-Helix, history = PromptLen + Generated −
// 1 (every token but the newest is final); Helix, history unchanged
// (§10.5). Capacity is unchanged. The growth record is cleared: the step is
// final and can no longer be reverted. History never decreases; one beyond
// capacity panics.
func (m *Manager) UpdateAfterGeneration(r *scheduler.Request) {
	s, ok := m.seq(r.ID)
	if !ok {
		return
	}
	s.growthRecorded = false
	if m.cfg.CP > 1 {
		return
	}
	m.setHistory(s, r.PromptLen+r.Generated-1)
}

// PrefixStats counts prefix reuse for the report. One admission is counted
// per cache, when its first context chunk has run (UpdateAfterContext):
// released admissions that never ran are not counted, and a recompute-reset
// request counts again with its new prompt (its new cache is a new
// admission).
type PrefixStats struct {
	// Admissions is the number of counted caches.
	Admissions int64
	// PromptTokens is Σ PromptLen over counted admissions.
	PromptTokens int64
	// ReusedTokens is Σ tokens claimed from the radix tree at creation
	// (prefill skipped) over counted admissions: prefix.reused_tokens.
	ReusedTokens int64
}

// HitRate is ReusedTokens / PromptTokens (0 when nothing was admitted):
// prefix.hit_rate.
func (p PrefixStats) HitRate() float64 {
	if p.PromptTokens == 0 {
		return 0
	}
	return float64(p.ReusedTokens) / float64(p.PromptTokens)
}

// PrefixStats returns the reuse counters so far.
func (m *Manager) PrefixStats() PrefixStats { return m.stats }

// ReusableBlocks is the number of blocks in the radix tree (cached or in
// use). With events on it equals the stored blocks minus the removed ones
// of the event stream: the end-of-run balance check.
func (m *Manager) ReusableBlocks() int {
	n := 0
	for _, b := range m.nodes {
		if !b.isRoot {
			n++
		}
	}
	return n
}
