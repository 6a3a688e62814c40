package kvpool

import (
	"github.com/lockstep-ai/lockstep/scheduler"
)

// KV cache events (kvcache.md §9): the per-manager buffer with its
// coalescing rules. Publication across ranks is the executor's (it owns the
// collectives); EventPublisher is the pure deque it publishes into.

// EventKind is the type of a KV cache event.
type EventKind uint8

// Event kinds.
const (
	// EventCreated: blocks per cache level, once, at construction (id 0).
	EventCreated EventKind = iota + 1
	// EventStored: blocks committed into the radix tree.
	EventStored
	// EventRemoved: blocks removed from the radix tree.
	EventRemoved
	// EventUpdated: a block's cache level changed (migration).
	EventUpdated
)

// String is the event type's wire name.
func (k EventKind) String() string {
	switch k {
	case EventCreated:
		return "created"
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventUpdated:
		return "updated"
	}
	return "unknown"
}

// DefaultBlockPriority is the priority of every stored block (§9.1).
const DefaultBlockPriority = 35

// StoredBlock is one block of a stored event.
type StoredBlock struct {
	Hash       scheduler.BlockKey
	Tokens     []int32
	CacheLevel int // 0 = GPU, 1 = host
	Priority   int
	CacheSalt  string // "" = none
}

// Event is one KV cache event (§9.1). Hashes are full block keys; HashAlgo
// says how they are rendered (BlockHash64 or KeyHex; AppendJSONL does it).
type Event struct {
	// ID is monotonic per manager from 0, without gaps.
	ID   uint64
	Kind EventKind
	// WindowSize is max_seq_len (one full-attention group).
	WindowSize int
	// AttentionDPRank is set only under attention-DP (HasDPRank).
	AttentionDPRank int
	HasDPRank       bool
	HashAlgo        EventHashAlgo

	// BlocksPerLevel (created): [gpu pages, host pages], host omitted
	// without a host tier.
	BlocksPerLevel []int
	// Parent (stored): the parent block; HasParent false for a child of a
	// root.
	Parent    scheduler.BlockKey
	HasParent bool
	// Blocks (stored).
	Blocks []StoredBlock
	// Hashes (removed): removed blocks, in order.
	Hashes []scheduler.BlockKey
	// Hash, FromLevel, ToLevel (updated): the block and its cache-level
	// change. Priority changes are never emitted.
	Hash               scheduler.BlockKey
	FromLevel, ToLevel int
}

// eventBuffer is the per-manager buffer of §9.3: pending events with ids,
// removed hashes without an id yet, and the pending stored event that may
// still grow.
type eventBuffer struct {
	enabled    bool
	nextID     uint64
	pending    []Event
	removedBuf []scheduler.BlockKey
	lastStored int // index in pending, −1 = none
	proto      Event
}

// init prepares the buffer and queues the created event (id 0).
func (b *eventBuffer) init(cfg Config) {
	b.lastStored = -1
	if cfg.EventBufferMaxSize <= 0 {
		return // §9.3: size 0 disables every event, including created
	}
	b.enabled = true
	b.proto = Event{WindowSize: cfg.MaxSeqLen, HashAlgo: cfg.EventHash,
		AttentionDPRank: cfg.AttentionDPRank, HasDPRank: cfg.AttentionDP}
	levels := []int{cfg.NumPages}
	if cfg.HostPages > 0 {
		levels = append(levels, cfg.HostPages)
	}
	e := b.next(EventCreated)
	e.BlocksPerLevel = levels
	b.pending = append(b.pending, e)
}

// next returns a new event of kind k with the next id.
func (b *eventBuffer) next(k EventKind) Event {
	e := b.proto
	e.ID, e.Kind = b.nextID, k
	b.nextID++
	return e
}

// stored records the commit of a new block n (its parent's key, if any, is
// the event's parent). The block becomes tracked.
func (b *eventBuffer) stored(n *node, lb int) {
	if !b.enabled {
		return
	}
	n.tracked = true
	b.flushRemoved()
	blk := StoredBlock{Hash: n.hash, Tokens: n.tokens, CacheLevel: int(n.loc.tier),
		Priority: DefaultBlockPriority, CacheSalt: n.salt}
	if b.lastStored >= 0 {
		last := &b.pending[b.lastStored]
		if !n.parent.isRoot && last.Blocks[len(last.Blocks)-1].Hash == n.parent.hash {
			last.Blocks = append(last.Blocks, blk)
			return
		}
	}
	e := b.next(EventStored)
	if !n.parent.isRoot {
		e.Parent, e.HasParent = n.parent.hash, true
	}
	e.Blocks = []StoredBlock{blk}
	b.pending = append(b.pending, e)
	b.lastStored = len(b.pending) - 1
}

// removed buffers the removal of n if it is tracked.
func (b *eventBuffer) removed(n *node) {
	if !b.enabled || !n.tracked {
		return
	}
	n.tracked = false
	b.removedBuf = append(b.removedBuf, n.hash)
}

// updated records a cache-level change of a tracked block.
func (b *eventBuffer) updated(n *node, from, to int) {
	if !b.enabled || !n.tracked {
		return
	}
	b.flushRemoved()
	e := b.next(EventUpdated)
	e.Hash, e.FromLevel, e.ToLevel = n.hash, from, to
	b.pending = append(b.pending, e)
}

// flushRemoved turns the buffered removals into one removed event.
func (b *eventBuffer) flushRemoved() {
	if len(b.removedBuf) == 0 {
		return
	}
	e := b.next(EventRemoved)
	e.Hashes = b.removedBuf
	b.removedBuf = nil
	b.pending = append(b.pending, e)
	b.lastStored = -1
}

// drain returns every pending event and clears the buffer.
func (b *eventBuffer) drain() []Event {
	b.flushRemoved()
	out := b.pending
	b.pending = nil
	b.lastStored = -1
	return out
}

// EventsEnabled reports whether KV cache events are on
// (EventBufferMaxSize > 0).
func (m *Manager) EventsEnabled() bool { return m.ev.enabled }

// FlushIterationEvents drains this rank's events: every event since the
// previous flush, in id order, ids contiguous with the previous flush (the
// first flush starts with created, id 0). The executor calls it once per
// iteration at the synced tail (executor.md §9), publishes
// LastEvents(events, EventBufferMaxSize) — through its allgather under
// attention-DP — and may write the full list to the --kv-events file. The
// slice is the caller's. Nil when events are off or nothing happened.
func (m *Manager) FlushIterationEvents() []Event { return m.ev.drain() }

// NextEventID is the id the next event will get (the count of events ever
// created by this manager).
func (m *Manager) NextEventID() uint64 { return m.ev.nextID }
