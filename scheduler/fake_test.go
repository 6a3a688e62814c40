package scheduler

import (
	"fmt"
	"slices"
	"strings"
)

// fakeKV is the scripted KV manager of the tests (spec §18.1). With pages 0
// the pool is unlimited and every call succeeds unless a script says
// otherwise; with pages > 0 it keeps page-pool books: P tokens per page,
// suspended caches leave the GPU only when a host tier exists, and
// GUARANTEED_NO_EVICT reservations (max(0, PagesToCompletion − held)) count
// against the available pages.
type fakeKV struct {
	P      int
	pages  int // GPU pages; 0 = unlimited
	host   bool
	reuse  bool
	policy ReusePolicy
	helix  bool

	caches map[uint64]*fakeCache

	// Scripts; nil means "decide by the pool". call is 1-based and counts the
	// calls of that kind since the last resetCounts.
	allocFn   func(call int, r *Request) bool
	resizeFn  func(call int, r *Request, n int) bool
	prepareFn func(r *Request) bool
	reuseLen  map[uint64]int    // first-chunk PrepareContext claims this prefix
	probeKey  map[uint64]string // ProbeFirstNewBlockKey result ("" = none)

	allocCalls, resizeCalls int
	allocIDs                []uint64
	probeCalls              int
	log                     []string // "Suspend(99)", "Free(3)", "Resize(0,128)", ...
}

type cacheState uint8

const (
	cacheActive cacheState = iota + 1
	cacheSuspended
)

type fakeCache struct {
	state    cacheState
	capacity int
	ptc      int  // pages to completion, > 0 once reserved (GNE)
	onHost   bool // every page migrated to the host tier (suspended caches only)
}

func newFakeKV() *fakeKV {
	return &fakeKV{P: 64, policy: PerRequest, caches: map[uint64]*fakeCache{},
		reuseLen: map[uint64]int{}, probeKey: map[uint64]string{}}
}

func (f *fakeKV) resetCounts() {
	f.allocCalls, f.resizeCalls, f.probeCalls = 0, 0, 0
	f.allocIDs, f.log = nil, nil
}

// setActive gives id an active cache of capacity tokens.
func (f *fakeKV) setActive(id uint64, capacity int) {
	f.caches[id] = &fakeCache{state: cacheActive, capacity: capacity}
}

// setSuspended gives id a suspended cache.
func (f *fakeKV) setSuspended(id uint64, capacity int) {
	f.caches[id] = &fakeCache{state: cacheSuspended, capacity: capacity}
}

func (f *fakeKV) count(prefix string) int {
	n := 0
	for _, l := range f.log {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// onGPU is the number of GPU pages c holds.
func (f *fakeKV) onGPU(c *fakeCache) int {
	if c.state == cacheActive || (c.state == cacheSuspended && !f.host) {
		return ceilDiv(c.capacity, f.P)
	}
	return 0
}

// reservedLeft is c's reservation not yet drawn.
func (f *fakeKV) reservedLeft(c *fakeCache) int {
	if c.ptc == 0 {
		return 0
	}
	return max(0, c.ptc-ceilDiv(c.capacity, f.P))
}

// freeFor is the number of GPU pages id may take: free pages minus every
// other request's reservation (its own reservation is its to draw from).
func (f *fakeKV) freeFor(id uint64) int {
	used, reserved := 0, 0
	for cid, c := range f.caches {
		used += f.onGPU(c)
		if cid != id {
			reserved += f.reservedLeft(c)
		}
	}
	return f.pages - used - reserved
}

// available is the GNE admission quantity: free minus every reservation.
func (f *fakeKV) available() int {
	used, reserved := 0, 0
	for _, c := range f.caches {
		used += f.onGPU(c)
		reserved += f.reservedLeft(c)
	}
	return f.pages - used - reserved
}

// grow sets id's capacity to capacity if the pool allows it.
func (f *fakeKV) grow(id uint64, c *fakeCache, capacity int) bool {
	if capacity <= c.capacity {
		return true
	}
	if f.pages > 0 {
		need := ceilDiv(capacity, f.P) - ceilDiv(c.capacity, f.P)
		if need > 0 && need > f.freeFor(id) {
			return false
		}
	}
	c.capacity = capacity
	return true
}

func (f *fakeKV) PrepareContext(r *Request) bool {
	f.log = append(f.log, fmt.Sprintf("Prepare(%d)", r.ID))
	if f.prepareFn != nil && !f.prepareFn(r) {
		return false
	}
	c := f.caches[r.ID]
	if c == nil {
		c = &fakeCache{state: cacheActive}
		f.caches[r.ID] = c
		if r.State == ContextInit {
			r.ContextPosition = f.reuseLen[r.ID]
		}
	}
	if c.state == cacheSuspended {
		c.state = cacheActive
	}
	return true
}

func (f *fakeKV) ResizeContext(r *Request, n int) bool {
	f.resizeCalls++
	f.log = append(f.log, fmt.Sprintf("Resize(%d,%d)", r.ID, n))
	c := f.caches[r.ID]
	if c == nil {
		panic(fmt.Sprintf("fakeKV: ResizeContext(%d) without a cache", r.ID))
	}
	if f.resizeFn != nil {
		if !f.resizeFn(f.resizeCalls, r, n) {
			return false
		}
		c.capacity = max(c.capacity, r.ContextPosition+n)
		return true
	}
	return f.grow(r.ID, c, r.ContextPosition+n)
}

func (f *fakeKV) PrepareBlocksIfSchedulable(r *Request, n int) bool {
	f.log = append(f.log, fmt.Sprintf("PrepareBlocks(%d,%d)", r.ID, n))
	c := f.caches[r.ID]
	ptc := PagesToCompletion(r, f.P)
	if f.pages > 0 && ptc > f.available()+f.onGPU(c) {
		return false
	}
	c.ptc = ptc
	if !f.grow(r.ID, c, r.ContextPosition+n) {
		c.ptc = 0
		return false
	}
	return true
}

func (f *fakeKV) ReleaseContextAdmission(r *Request) {
	f.log = append(f.log, fmt.Sprintf("Release(%d)", r.ID))
	delete(f.caches, r.ID)
	r.ContextPosition = 0
}

func (f *fakeKV) TryAllocateGeneration(r *Request) bool {
	f.allocCalls++
	f.allocIDs = append(f.allocIDs, r.ID)
	c := f.caches[r.ID]
	if c == nil {
		return false
	}
	if f.allocFn != nil {
		if !f.allocFn(f.allocCalls, r) {
			return false
		}
		c.state = cacheActive
		c.capacity++
	} else {
		was := c.state
		if was == cacheSuspended && f.host && f.pages > 0 && ceilDiv(c.capacity, f.P) > f.freeFor(r.ID) {
			return false
		}
		c.state = cacheActive
		if !f.grow(r.ID, c, c.capacity+1) {
			c.state = was
			return false
		}
	}
	if f.helix {
		r.HelixDecodeCount++
	}
	return true
}

func (f *fakeKV) RevertAllocateGeneration(r *Request) {
	if c := f.caches[r.ID]; c != nil && c.capacity > 0 {
		c.capacity--
	}
	if f.helix && r.HelixDecodeCount > 0 {
		r.HelixDecodeCount--
	}
}

func (f *fakeKV) Suspend(r *Request) {
	f.log = append(f.log, fmt.Sprintf("Suspend(%d)", r.ID))
	if c := f.caches[r.ID]; c != nil {
		c.state = cacheSuspended
	}
}

func (f *fakeKV) Free(r *Request) {
	f.log = append(f.log, fmt.Sprintf("Free(%d)", r.ID))
	delete(f.caches, r.ID)
}

func (f *fakeKV) IsActive(id uint64) bool {
	c := f.caches[id]
	return c != nil && c.state == cacheActive
}

func (f *fakeKV) HasCache(id uint64) bool { return f.caches[id] != nil }

// HoldsDevicePages: a cache is on the device unless a test moved it to the
// host (onHost).
func (f *fakeKV) HoldsDevicePages(id uint64) bool {
	c := f.caches[id]
	return c != nil && !c.onHost
}
func (f *fakeKV) HasHostTier() bool       { return f.host }
func (f *fakeKV) BlockReuseEnabled() bool { return f.reuse }
func (f *fakeKV) ReusePolicy() ReusePolicy {
	return f.policy
}

func (f *fakeKV) ProbeFirstNewBlockKey(r *Request) (BlockKey, bool) {
	f.probeCalls++
	name := f.probeKey[r.ID]
	if name == "" {
		return BlockKey{}, false
	}
	var k BlockKey
	copy(k[:], name)
	return k, true
}

// --- scripts ---

// allocOK succeeds exactly on the listed call numbers.
func allocOK(calls ...int) func(int, *Request) bool {
	return func(call int, _ *Request) bool { return slices.Contains(calls, call) }
}

// allocFail fails exactly on the listed call numbers.
func allocFail(calls ...int) func(int, *Request) bool {
	return func(call int, _ *Request) bool { return !slices.Contains(calls, call) }
}

func allocNever(int, *Request) bool { return false }

// resizeFailIDs fails every resize of the listed ids.
func resizeFailIDs(ids ...uint64) func(int, *Request, int) bool {
	return func(_ int, r *Request, _ int) bool { return !slices.Contains(ids, r.ID) }
}

// resizeFailCalls fails the listed resize calls.
func resizeFailCalls(calls ...int) func(int, *Request, int) bool {
	return func(call int, _ *Request, _ int) bool { return !slices.Contains(calls, call) }
}

// --- request builders (spec §18.1 notation) ---

func newReq(id uint64, st State, prompt, pos int) *Request {
	return &Request{ID: id, State: st, PromptLen: prompt, ContextPosition: pos, MaxNewTokens: 16,
		UncachedEstimate: UnsetEstimate, BatchIndex: NoBatchIndex}
}

// gen is GENERATION_IN_PROGRESS with an active cache (registered by the harness).
func gen(id uint64) *Request { return newReq(id, GenerationInProgress, 10, 10) }

// ctx is a CONTEXT_INIT first chunk with l remaining.
func ctx(id uint64, l int) *Request { return newReq(id, ContextInit, l, 0) }

// cont is CONTEXT_IN_PROGRESS with an active cache and l remaining.
func cont(id uint64, l int) *Request { return newReq(id, ContextInProgress, l, 0) }

// contAt is a continuation at depth p with rem remaining.
func contAt(id uint64, p, rem int) *Request { return newReq(id, ContextInProgress, p+rem, p) }

// withEst sets an uncached estimate.
func withEst(r *Request, est int64) *Request { r.UncachedEstimate = est; return r }

// withState overrides the state.
func withState(r *Request, st State) *Request { r.State = st; return r }

// register gives every started request in list an active cache unless it
// already has one (tests pre-set suspended ones).
func (f *fakeKV) register(list []*Request) {
	for _, r := range list {
		if _, ok := f.caches[r.ID]; ok {
			continue
		}
		if started(r.State) {
			f.setActive(r.ID, max(r.ContextPosition, 1))
		}
	}
}

func ids(rs []*Request) []uint64 {
	out := make([]uint64, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func chunks(rs []*Request) []int {
	out := make([]int, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ChunkSize)
	}
	return out
}

// --- sim.Pool (scheduler/sim drives the fake in the scenario tests) ---

// Materialize gives r an active cache holding its existing KV.
func (f *fakeKV) Materialize(r *Request) error {
	capacity := r.ContextPosition
	if r.Generated > 0 {
		capacity = r.PromptLen + r.Generated - 1
	}
	c := &fakeCache{state: cacheActive}
	if !f.grow(r.ID, c, capacity) {
		return fmt.Errorf("pool too small for %d tokens", capacity)
	}
	f.caches[r.ID] = c
	return nil
}

// AfterContext has nothing to commit in the fake.
func (f *fakeKV) AfterContext(*Request) error { return nil }

// AfterGeneration has nothing to commit in the fake.
func (f *fakeKV) AfterGeneration(*Request) error { return nil }

// opsOn lists the logged Suspend/Free calls on id, in order.
func (f *fakeKV) opsOn(id uint64) []string {
	var out []string
	for _, l := range f.log {
		if l == fmt.Sprintf("Suspend(%d)", id) || l == fmt.Sprintf("Free(%d)", id) {
			out = append(out, l)
		}
	}
	return out
}

// FirstChunkBlocked never promises a failure: every first chunk is tried.
func (f *fakeKV) FirstChunkBlocked(*Request, func(*Request, int) int) bool { return false }

// NoFirstChunkFits never promises a failure.
func (f *fakeKV) NoFirstChunkFits() bool { return false }

// ObtainablePages is the admission watermark's page count (PageCounter):
// free minus every reservation, or a large number for an unlimited pool.
func (f *fakeKV) ObtainablePages() int {
	if f.pages == 0 {
		return 1 << 30
	}
	return f.available()
}
