package kvpool

import (
	"fmt"
	"math/bits"
)

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

// tierPool is one tier's page bookkeeping (kvcache.md §4.1): the free set
// and, per page, how many active sequences lock it, how many suspended
// sequences hold it, and the radix block whose page it is (nil for a
// private page). A page is free, referenced (locks + holds > 0), or, on the
// GPU only, cached (a block's page that nobody references).
//
// The free set is a two-level bitmap of page indices: allocation takes the
// lowest free index first (§4.2 step 2), so the indices handed out depend
// only on the call sequence, never on map order or on the order in which
// pages were freed. take finds the lowest set bit through the summary word
// of non-empty words (from the lowest summary word that can hold one), put
// sets a bit; neither allocates. (A binary heap did the same in
// O(log pages) cache misses: 2 % of a 64-rank twin run.)
type tierPool struct {
	free  []uint64 // bit p%64 of word p/64: page p is free
	sum   []uint64 // bit w%64 of word w/64: free[w] != 0
	lo    int      // no summary word below lo has a bit set
	nfree int
	locks []int32 // per page: active sequences using it
	holds []int32 // per page: suspended sequences holding it
	owner []*node // per page: the radix block stored in it, or nil
}

// newTierPool returns a pool of n free pages.
func newTierPool(n int) tierPool {
	words := (n + 63) / 64
	p := tierPool{
		free:  make([]uint64, words),
		sum:   make([]uint64, (words+63)/64),
		locks: make([]int32, n),
		holds: make([]int32, n),
		owner: make([]*node, n),
	}
	for pg := range n {
		p.setFree(int32(pg))
	}
	return p
}

// numPages is the pool size.
func (p *tierPool) numPages() int { return len(p.locks) }

// numFree is the number of free pages.
func (p *tierPool) numFree() int { return p.nfree }

// isFree reports whether page is in the free set.
func (p *tierPool) isFree(page int32) bool { return p.free[page/64]&(1<<(page%64)) != 0 }

// refs is the number of sequences referencing page.
func (p *tierPool) refs(page int32) int32 { return p.locks[page] + p.holds[page] }

// take removes the lowest free page from the free set and returns it with
// no reference; the caller adds one. The caller has checked numFree() > 0.
func (p *tierPool) take() int32 {
	for i := p.lo; i < len(p.sum); i++ {
		if p.sum[i] == 0 {
			continue
		}
		p.lo = i
		w := 64*i + bits.TrailingZeros64(p.sum[i])
		page := int32(64*w + bits.TrailingZeros64(p.free[w]))
		p.free[w] &^= 1 << (page % 64)
		if p.free[w] == 0 {
			p.sum[i] &^= 1 << (w % 64)
		}
		p.nfree--
		return page
	}
	panic("kvpool: invariant take-needs-a-free-page: no free page")
}

// put returns an unreferenced, ownerless page to the free set.
func (p *tierPool) put(page int32) {
	if p.refs(page) != 0 || p.owner[page] != nil || p.isFree(page) {
		panic(fmt.Sprintf("kvpool: invariant free-page-unowned: page %d freed with %d refs, owner %v, already free %v",
			page, p.refs(page), p.owner[page] != nil, p.isFree(page)))
	}
	p.setFree(page)
}

func (p *tierPool) setFree(page int32) {
	w := int(page / 64)
	p.free[w] |= 1 << (page % 64)
	p.sum[w/64] |= 1 << (w % 64)
	p.lo = min(p.lo, w/64)
	p.nfree++
}

// freePages lists the free pages in ascending order (invariant checks).
func (p *tierPool) freePages() []int32 {
	out := make([]int32, 0, p.nfree)
	for w, word := range p.free {
		for word != 0 {
			out = append(out, int32(64*w+bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
	return out
}
