package kvpool

import (
	"fmt"
)

// SeqStatus is a sequence's place in the status machine of kvcache.md §5.2:
//
//	create ──► SUSPENDED ──resume──► ACTIVE
//	              ▲                     │
//	              └──────suspend────────┘
//	any status ──close──► CLOSED (idempotent)
type SeqStatus int

// Sequence statuses.
const (
	// SeqSuspended: pages are held, not locked; resize is refused; pages may
	// migrate to the host tier under GPU pressure.
	SeqSuspended SeqStatus = iota + 1
	// SeqActive: pages are locked on the GPU; the sequence may run and grow.
	SeqActive
	// SeqClosed: every page was released. A closed sequence is forgotten by
	// the Manager, so callers only see it in SequenceInfo snapshots taken
	// earlier.
	SeqClosed
)

// String names the status as the spec does.
func (s SeqStatus) String() string {
	switch s {
	case SeqSuspended:
		return "SUSPENDED"
	case SeqActive:
		return "ACTIVE"
	case SeqClosed:
		return "CLOSED"
	}
	return fmt.Sprintf("SeqStatus(%d)", int(s))
}

// blockRef is one ledger block of a sequence: either a radix block (n != nil;
// the page is n.loc, shared with other sequences) or a private page (loc).
// Each blockRef is one lock (ACTIVE) or one hold (SUSPENDED) on its page.
type blockRef struct {
	n   *node
	loc pageLoc
}

// where is the page of the block.
func (b blockRef) where() pageLoc {
	if b.n != nil {
		return b.n.loc
	}
	return b.loc
}

// sequence is one request's KV cache (kvcache.md §5). Lengths obey
// committed ≤ history ≤ capacity ≤ len(blocks)·ledger block and
// len(blocks) = ceil(capacity / ledger block).
//
// Sequences are recycled by the Manager (slices survive), so no pointer to
// one escapes the package.
type sequence struct {
	id     uint64
	status SeqStatus
	dummy  bool
	// blocks are the ledger blocks in token order.
	blocks []blockRef
	// table is the page-table row content: the GPU page of each block. It
	// is exact while ACTIVE (every page of an active sequence is on the
	// GPU) and rebuilt on every resume.
	table []int32
	// row is the page-table row index (§4.3).
	row int

	capacity  int // history plus the inputs of the next step
	history   int // tokens that are final; never decreases
	committed int // tokens published in the radix tree

	// growthRecorded: the last TryAllocateGeneration succeeded and has not
	// been reverted or made final by UpdateAfterGeneration.
	growthRecorded bool
	// reserveTarget: PagesToCompletion at GUARANTEED_NO_EVICT admission;
	// 0 for a sequence without a reservation.
	reserveTarget int
	// suspendedAt orders migration victims (§4.2 step 4): the manager tick
	// of the last suspension (creation counts as one).
	suspendedAt uint64
	// g is the Helix decode counter (§10.5), owned here.
	g int

	// Prefix reuse (§6). root is the scope's root; the chain keys of the
	// prompt's blocks are cached on the request (scheduler.BlockKeyChain).
	root *node
	// reusedTokens is the match claimed at creation (m of §6.3).
	reusedTokens int
	// partialPending: the block after the matched full blocks is a shared
	// partial radix block, copied into a private page on first resume
	// (copy-on-resume, §6.4).
	partialPending bool
	// claimedLocked: claimPrefix took the matched blocks as locks, not
	// holds, and the sequence has not been resumed since (all on the GPU).
	claimedLocked bool
	// stopped: committing has ended (stopCommitting, a virtual stop, or
	// reuse off).
	stopped bool
	// contextDone: the whole prompt ran (UpdateAfterContext at its end).
	contextDone bool
	// counted: the first-chunk admission was counted in PrefixStats.
	counted bool
	// claimStamps are the cached blocks claimPrefix took, with their LRU
	// stamps, so that an admission released unscheduled restores them
	// (ReleaseContextAdmission).
	claimStamps []claimStamp
	// inserted lists the radix blocks this sequence inserted (not those it
	// reused or rebased onto): its PER_CONVERSATION drop plan (§7).
	inserted []*node
	// blockHint is the most ledger blocks the request can come to hold
	// (prompt plus generation limit, at most the pool), set at creation:
	// blocks and table grow to it at once, so a decode that crosses into
	// a new page appends without allocating (issue 24: 0 allocations per
	// steady-state iteration).
	blockHint int
	// conv is the conversation this sequence is the current request of
	// ("" = none, or ignored because another request was current).
	conv string
}

// reservation is the pages still reserved for the sequence:
// max(0, reserveTarget − pages held) (scheduler.md §14.2).
func (s *sequence) reservation() int {
	return max(0, s.reserveTarget-len(s.blocks))
}

// reset clears a recycled sequence, keeping the backing arrays.
func (s *sequence) reset(id uint64) {
	*s = sequence{id: id, status: SeqSuspended, row: -1,
		blocks: s.blocks[:0], table: s.table[:0], inserted: s.inserted[:0], claimStamps: s.claimStamps[:0]}
}

// grow gives blocks and table room for n entries, keeping their contents.
func (s *sequence) grow(n int) {
	if cap(s.blocks) < n {
		s.blocks = append(make([]blockRef, 0, n), s.blocks...)
	}
	if cap(s.table) < n {
		s.table = append(make([]int32, 0, n), s.table...)
	}
}

// claimStamp is a cached block claimed at admission and its LRU stamp then.
type claimStamp struct {
	n       *node
	lastUse uint64
}

// SequenceInfo is a snapshot of one sequence, for tests, logs and metrics.
type SequenceInfo struct {
	ID        uint64
	Status    SeqStatus
	Capacity  int // tokens (global under Helix)
	History   int // tokens
	Committed int // tokens published in the radix tree
	Pages     int // ledger blocks (pages on this rank)
	// HostPages is how many of the sequence's pages are on the host tier.
	HostPages int
	// ReservedPages is the GUARANTEED_NO_EVICT reservation still unallocated.
	ReservedPages int
	// GrowthRecorded: a generation growth can be reverted.
	GrowthRecorded bool
	Dummy          bool
	// Row is the page-table row.
	Row int
	// ReusedTokens is the prefix claimed from the radix tree at creation.
	ReusedTokens int
	// Stopped: committing has ended.
	Stopped bool
	// HelixDecodeCount is g (§10.5).
	HelixDecodeCount int
}

func (s *sequence) info() SequenceInfo {
	host := 0
	for _, b := range s.blocks {
		if b.where().tier == TierHost {
			host++
		}
	}
	return SequenceInfo{
		ID: s.id, Status: s.status, Capacity: s.capacity, History: s.history,
		Committed: s.committed, Pages: len(s.blocks), HostPages: host, ReservedPages: s.reservation(),
		GrowthRecorded: s.growthRecorded, Dummy: s.dummy, Row: s.row, ReusedTokens: s.reusedTokens,
		Stopped: s.stopped, HelixDecodeCount: s.g,
	}
}
