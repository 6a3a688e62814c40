package router

// PopWaiting takes requests from the waiting queue for routing (spec §1.5).
//
// The budget is H·dp − Σ active: the fleet never holds more than H requests
// per rank on average. Items are examined first come first served until the
// budget is taken; a strict item whose target rank already holds H requests
// (counting the strict items taken before it in this pop) is put back.
// remaining is the put-back items, in order, followed by the items not
// examined, so put-backs keep their place at the front of the queue.
//
// taken and remaining are new slices; waiting is not modified. Both are nil
// when empty. Relaxed items are never put back, even when their target is
// full: routing balances them elsewhere.
//
// PopWaiting copies the whole queue; a caller with a deep queue uses a
// Popper, which examines the queue from its head and touches only what it
// examines.
func PopWaiting(waiting []Item, states []RankState, maxActivePerRank int) (taken, remaining []Item) {
	if len(waiting) == 0 {
		return nil, nil
	}
	var p Popper
	p.Begin(states, maxActivePerRank)
	i := 0
	for ; i < len(waiting) && p.Open(); i++ {
		if !p.Offer(waiting[i]) {
			remaining = append(remaining, waiting[i])
		}
	}
	remaining = append(remaining, waiting[i:]...)
	if t := p.Taken(); len(t) > 0 {
		taken = append([]Item(nil), t...)
	}
	return taken, remaining
}

// A Popper is PopWaiting without copies, for a queue the caller keeps (a
// deque read from its head): Begin, then Offer the queue's items in order
// while Open, then remove the offered items from the queue's head and put
// the ones Offer refused back at its front, in order. The work is
// proportional to the items offered, not to the queue's length, and a
// reused Popper allocates nothing once its buffers have grown.
//
//	p.Begin(states, H)
//	for i := 0; i < q.Len() && p.Open(); i++ { if !p.Offer(item(q.At(i))) { keep i } }
//	res := r.Route(p.Taken(), states)
type Popper struct {
	running []int // per rank: active requests plus the strict items taken for it
	budget  int
	capH    int // H, max_num_active_requests
	taken   []Item
}

// Begin starts a pop against the gathered states (budget H·dp − Σ active).
// It panics unless the states name every rank 0..dp-1 exactly once.
func (p *Popper) Begin(states []RankState, maxActivePerRank int) {
	dp := len(states)
	p.running = grow(p.running, dp)
	rankVectors(states, p.running, nil, false)
	p.budget = maxActivePerRank * dp
	for _, c := range p.running {
		p.budget -= c
	}
	p.taken = p.taken[:0]
	p.capH = maxActivePerRank
}

// Open reports whether the budget still has room: while it does, the next
// item of the queue is offered; once it does not, the rest stays unexamined.
func (p *Popper) Open() bool { return len(p.taken) < p.budget }

// Offer examines the next item of the queue (call only while Open). It
// reports whether the item was taken; false means it is put back (a strict
// item whose target rank is full), to stay at the front of the queue.
func (p *Popper) Offer(it Item) bool {
	dp := len(p.running)
	if t := it.target(dp); it.Strict && t >= 0 {
		if p.running[t] >= p.capH {
			return false
		}
		p.running[t]++
	}
	p.taken = append(p.taken, it)
	return true
}

// Taken is the items taken so far, in pop order: the input of Route. It
// belongs to the Popper and is valid until the next Begin.
func (p *Popper) Taken() []Item { return p.taken }
