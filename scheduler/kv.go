package scheduler

// ReusePolicy says when prompt blocks become reusable (kvcache.md §7).
type ReusePolicy int

// Reuse policies.
const (
	AllReusable ReusePolicy = iota
	PerRequest
	PerConversation
)

// BlockKey identifies a radix-tree block (kvcache.md §6.1).
type BlockKey [32]byte

// BlockKeyChain caches the chain keys of a request's full prompt blocks for
// the KV manager, so that a request waiting through many passes has its
// prefix hashed once, not at every pass (issue 24: SHA-256 was a quarter of
// a deep-queue pass). Keys[k] is the key of tokens [k·Block, (k+1)·Block)
// under Root; the chain grows as far as a lookup needed it.
//
// The KV manager owns it: it fills it, and it drops it when the root, the
// block size or the token array changed (Tokens names the array by its
// first element). Contract of the owner of Request.Tokens: the tokens of an
// array are never rewritten in place; a new prompt is a new slice (the
// recompute reset builds one). The executor never reads the chain.
type BlockKeyChain struct {
	Root   BlockKey
	Block  int
	Tokens *int32
	Keys   []BlockKey
	// Memo is the KV manager's note of the prompt's last match against
	// its radix tree, opaque to everyone else.
	Memo any
}

// KVManager is the narrow KV side the scheduler calls (spec §17). The
// scheduler never touches page lists; kvpool implements it, and a scripted
// fake drives the scheduler's tests. Every call that can fail either succeeds
// or leaves everything unchanged.
type KVManager interface {
	// PrepareContext creates or resumes r's cache and, for a first chunk,
	// claims the reusable prefix (may advance r.ContextPosition).
	PrepareContext(r *Request) bool
	// ResizeContext makes capacity ≥ r.ContextPosition + n.
	ResizeContext(r *Request, n int) bool
	// PrepareBlocksIfSchedulable is the GUARANTEED_NO_EVICT first-chunk
	// admission: reserve pages to completion, then ResizeContext(r, n).
	PrepareBlocksIfSchedulable(r *Request, n int) bool
	// ReleaseContextAdmission undoes a first-chunk admission that did not end
	// SCHEDULED: closes the cache and rewinds r.ContextPosition to 0.
	ReleaseContextAdmission(r *Request)
	// TryAllocateGeneration resumes a suspended cache, then grows capacity by
	// one token (Helix: g += 1).
	TryAllocateGeneration(r *Request) bool
	// RevertAllocateGeneration undoes the last successful generation growth.
	RevertAllocateGeneration(r *Request)
	// Suspend suspends r's cache (pages held, possibly moved to the host tier).
	Suspend(r *Request)
	// Free closes r's cache and releases its pages and reservations.
	Free(r *Request)
	// IsActive reports whether id has an active cache.
	IsActive(id uint64) bool
	// HasCache reports whether id has a cache (active or suspended).
	HasCache(id uint64) bool
	// HoldsDevicePages reports whether id's cache (active or suspended) has
	// at least one page on the device: freeing it would free device pages.
	// With a host tier a suspended cache may have every page on the host.
	HoldsDevicePages(id uint64) bool
	// HasHostTier reports whether suspension frees device pages.
	HasHostTier() bool
	// BlockReuseEnabled reports whether radix reuse is on.
	BlockReuseEnabled() bool
	// ReusePolicy is the reuse policy in force.
	ReusePolicy() ReusePolicy
	// ProbeFirstNewBlockKey returns the key of the first full block of r's
	// lookup tokens that is not on the device, if any.
	ProbeFirstNewBlockKey(r *Request) (BlockKey, bool)
	// FirstChunkBlocked reports, changing nothing the scheduler can
	// observe, that r (CONTEXT_INIT, no cache) is certain to fail its
	// MAX_UTILIZATION first-chunk allocation, and that the failed admission
	// would leave no trace: its chunk is chunk(r, matched) tokens once a
	// reusable prefix of matched tokens is claimed (0: a chunk the scheduler
	// skips). false means "try it".
	FirstChunkBlocked(r *Request, chunk func(r *Request, matched int) int) bool
	// NoFirstChunkFits reports, changing nothing, that every MAX_UTILIZATION
	// first-chunk allocation is certain to fail now, leaving no trace, for
	// want of any page to give (none free, none cached, none to migrate).
	NoFirstChunkFits() bool
}
