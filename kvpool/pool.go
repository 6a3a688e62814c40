package kvpool

// pagePool is the device tier's page bookkeeping (kvcache.md §4.1): the free
// list and, per page, how many active sequences lock it and how many
// suspended sequences hold it. A page with neither is on the free list.
//
// The free list is a binary min-heap of page indices stored in one []int32:
// allocation takes the lowest free index first, as §4.2 step 2 requires, so
// the indices handed out depend only on the call sequence (never on map
// order or on the order in which pages were freed). Take and put are
// O(log pages) and never allocate.
type pagePool struct {
	free  []int32 // min-heap of free page indices
	locks []int32 // per page: active sequences using it
	holds []int32 // per page: suspended sequences holding it
}

// newPagePool returns a pool of n free pages. An ascending slice is already a
// valid min-heap.
func newPagePool(n int) pagePool {
	p := pagePool{
		free:  make([]int32, n),
		locks: make([]int32, n),
		holds: make([]int32, n),
	}
	for i := range p.free {
		p.free[i] = int32(i)
	}
	return p
}

// numPages is the pool size.
func (p *pagePool) numPages() int { return len(p.locks) }

// numFree is the number of free pages.
func (p *pagePool) numFree() int { return len(p.free) }

// take removes the lowest free page and locks it for one active sequence.
// The caller has checked that a page is free.
func (p *pagePool) take() int32 {
	h := p.free
	page := h[0]
	last := len(h) - 1
	h[0] = h[last]
	p.free = h[:last]
	p.siftDown(0)
	p.locks[page] = 1
	return page
}

// unlock drops one active reference; the page returns to the free list when
// nothing references it any more.
func (p *pagePool) unlock(page int32) {
	if p.locks[page] <= 0 {
		panic("kvpool: invariant page-refcount: unlock of an unlocked page")
	}
	p.locks[page]--
	p.maybeFree(page)
}

// unhold drops one suspended reference (see unlock).
func (p *pagePool) unhold(page int32) {
	if p.holds[page] <= 0 {
		panic("kvpool: invariant page-refcount: unhold of an unheld page")
	}
	p.holds[page]--
	p.maybeFree(page)
}

// lockToHold turns an active reference into a suspended one (suspend).
func (p *pagePool) lockToHold(page int32) {
	if p.locks[page] <= 0 {
		panic("kvpool: invariant page-refcount: suspend of an unlocked page")
	}
	p.locks[page]--
	p.holds[page]++
}

// holdToLock turns a suspended reference into an active one (resume).
func (p *pagePool) holdToLock(page int32) {
	if p.holds[page] <= 0 {
		panic("kvpool: invariant page-refcount: resume of an unheld page")
	}
	p.holds[page]--
	p.locks[page]++
}

// maybeFree pushes an unreferenced page onto the free list. (With radix
// reuse, a committed page will become "cached" here instead.)
func (p *pagePool) maybeFree(page int32) {
	if p.locks[page] != 0 || p.holds[page] != 0 {
		return
	}
	p.free = append(p.free, page)
	p.siftUp(len(p.free) - 1)
}

func (p *pagePool) siftUp(i int) {
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

func (p *pagePool) siftDown(i int) {
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
