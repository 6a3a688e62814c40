package kvpool

import "fmt"

// SeqStatus is a sequence's place in the status machine of kvcache.md §5.2:
//
//	create ──► SUSPENDED ──resume──► ACTIVE
//	              ▲                     │
//	              └──────suspend────────┘
//	any status ──close──► CLOSED (idempotent)
type SeqStatus int

// Sequence statuses.
const (
	// SeqSuspended: pages are held, not locked; resize is refused.
	SeqSuspended SeqStatus = iota + 1
	// SeqActive: pages are locked; the sequence may run and grow.
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

// sequence is one request's KV cache (kvcache.md §5). Lengths obey
// committed ≤ history ≤ capacity ≤ len(pages)·P and
// len(pages) = ceil(capacity/P).
//
// Sequences are recycled by the Manager (the pages backing array survives),
// so no pointer to one escapes the package.
type sequence struct {
	id     uint64
	status SeqStatus
	// pages is the block table: page indices in token order.
	pages []int32
	// capacity: history plus the inputs of the next step.
	capacity int
	// history: tokens that are final; never decreases.
	history int
	// committed: tokens published for reuse; always 0 without radix reuse.
	committed int
	// growthRecorded: the last TryAllocateGeneration succeeded and has not
	// been reverted or made final by UpdateAfterGeneration.
	growthRecorded bool
	// reserveTarget: PagesToCompletion at GUARANTEED_NO_EVICT admission;
	// 0 for a sequence without a reservation.
	reserveTarget int
	// dummy marks a padding sequence created by AddDummy.
	dummy bool
}

// reservation is the pages still reserved for the sequence:
// max(0, reserveTarget − pages held) (scheduler.md §14.2).
func (s *sequence) reservation() int {
	return max(0, s.reserveTarget-len(s.pages))
}

// reset clears a recycled sequence, keeping the pages backing array.
func (s *sequence) reset(id uint64) {
	*s = sequence{id: id, status: SeqSuspended, pages: s.pages[:0]}
}

// SequenceInfo is a snapshot of one sequence, for tests, logs and metrics.
type SequenceInfo struct {
	ID        uint64
	Status    SeqStatus
	Capacity  int // tokens
	History   int // tokens
	Committed int // tokens
	Pages     int // pages held (len of the block table)
	// ReservedPages is the GUARANTEED_NO_EVICT reservation still unallocated.
	ReservedPages int
	// GrowthRecorded: a generation growth can be reverted.
	GrowthRecorded bool
	Dummy          bool
}

func (s *sequence) info() SequenceInfo {
	return SequenceInfo{
		ID: s.id, Status: s.status, Capacity: s.capacity, History: s.history,
		Committed: s.committed, Pages: len(s.pages), ReservedPages: s.reservation(),
		GrowthRecorded: s.growthRecorded, Dummy: s.dummy,
	}
}
