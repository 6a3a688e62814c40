package kvpool

import "fmt"

// Tier is a page's memory tier (kvcache.md §1). The values are those of
// eng_tier in native/include/engine.h.
type Tier uint8

// Tiers.
const (
	// TierGPU is the device tier; it always exists.
	TierGPU Tier = 0
	// TierHost is the pinned host tier (Config.HostPages > 0).
	TierHost Tier = 1
)

// String names the tier.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierHost:
		return "host"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// pageLoc addresses one page: its tier and its index in that tier's slab.
type pageLoc struct {
	tier Tier
	page int32
}

// tierPool is one tier's page bookkeeping (kvcache.md §4.1): the free list
// and, per page, how many active sequences lock it, how many suspended
// sequences hold it, and the radix block whose page it is (nil for a
// private page). A page is free, referenced (locks + holds > 0), or, on the
// GPU only, cached (a block's page that nobody references).
//
// The free list is a binary min-heap of page indices: allocation takes the
// lowest free index first (§4.2 step 2), so the indices handed out depend
// only on the call sequence, never on map order or on the order in which
// pages were freed. take and put are O(log pages) and never allocate.
type tierPool struct {
	free  []int32 // min-heap of free page indices
	locks []int32 // per page: active sequences using it
	holds []int32 // per page: suspended sequences holding it
	owner []*node // per page: the radix block stored in it, or nil
}

// newTierPool returns a pool of n free pages. An ascending slice is already
// a valid min-heap.
func newTierPool(n int) tierPool {
	p := tierPool{
		free:  make([]int32, n),
		locks: make([]int32, n),
		holds: make([]int32, n),
		owner: make([]*node, n),
	}
	for i := range p.free {
		p.free[i] = int32(i)
	}
	return p
}

// numPages is the pool size.
func (p *tierPool) numPages() int { return len(p.locks) }

// numFree is the number of free pages.
func (p *tierPool) numFree() int { return len(p.free) }

// refs is the number of sequences referencing page.
func (p *tierPool) refs(page int32) int32 { return p.locks[page] + p.holds[page] }

// take removes the lowest free page from the free list and returns it with
// no reference; the caller adds one. The caller has checked numFree() > 0.
func (p *tierPool) take() int32 {
	h := p.free
	page := h[0]
	last := len(h) - 1
	h[0] = h[last]
	p.free = h[:last]
	p.siftDown(0)
	return page
}

// put returns an unreferenced, ownerless page to the free list.
func (p *tierPool) put(page int32) {
	if p.refs(page) != 0 || p.owner[page] != nil {
		panic(fmt.Sprintf("kvpool: invariant free-page-unowned: page %d freed with %d refs, owner %v",
			page, p.refs(page), p.owner[page] != nil))
	}
	p.free = append(p.free, page)
	p.siftUp(len(p.free) - 1)
}

func (p *tierPool) siftUp(i int) {
	h := p.free
	for i > 0 {
		parent := (i - 1) / 2
		if h[parent] <= h[i] {
			return
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

func (p *tierPool) siftDown(i int) {
	h := p.free
	n := len(h)
	for {
		least := i
		if l := 2*i + 1; l < n && h[l] < h[least] {
			least = l
		}
		if r := 2*i + 2; r < n && h[r] < h[least] {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
