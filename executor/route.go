package executor

import (
	"slices"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// Route and admit (DESIGN.md §2 step 2): every rank runs the same router on
// the gathered rank states and the broadcast arrivals, keeps its own
// assignments and admits them (executor.md §3 steps 3–5).

// route appends the arrivals to the waiting queue, pops what the ranks can
// take and routes it with the deterministic router (router-and-calibration.md
// §1): every rank runs the same calls on the same agreed inputs (the gathered
// states, the broadcast items) and keeps its own assignments, with the
// router's uncached-prefill estimate.
func (e *Executor) route(items []Arrival, states []RankState) {
	e.routed = 0
	e.waiting.PushBack(items)
	if e.waiting.Len() == 0 {
		return
	}
	rs := e.routerStates[:0]
	for _, s := range states {
		rs = append(rs, router.RankState{Rank: int(s.Rank), ActiveRequests: int(s.ActiveRequests),
			ActiveTokens: s.ActiveTokens, RetiringRequests: int(s.RetiringRequests), PendingPrefill: s.PendingPrefill})
	}
	e.routerStates = rs
	// Pop from the head of the queue (router.Popper): only the arrivals
	// examined are converted and touched, whatever the queue's depth. An
	// item's ID is its position in the queue during this call.
	p := &e.popper
	p.Begin(rs, e.cfg.MaxActivePerRank)
	kept := e.putBack[:0]
	examined := 0
	for ; examined < e.waiting.Len() && p.Open(); examined++ {
		a := e.waiting.At(examined)
		it := router.Item{ID: uint64(examined), PromptLen: a.promptLen(), ConversationID: a.ConversationID,
			AffinityID: a.Routing.AffinityID, HasTarget: a.Routing.HasRank, Target: a.Routing.Rank, Strict: a.Routing.Strict}
		if !p.Offer(it) {
			kept = append(kept, *a)
		}
	}
	taken := p.Taken()
	e.routed = len(taken)
	res := e.cfg.Router.Route(taken, rs)
	for _, i := range res.Order {
		if res.Ranks[i] == e.cfg.Rank {
			e.admit(*e.waiting.At(int(taken[i].ID)), res.Estimate(i))
		}
	}
	// The examined arrivals leave the queue; the put-backs return to its
	// front, in order, ahead of the unexamined ones.
	e.waiting.DropFront(examined)
	e.waiting.PushFront(kept)
	e.waiting.Trim()
	clear(kept)
	e.putBack = kept[:0]
	if cap(kept) > maxKeptSlots {
		e.putBack = nil
	}
}

// admitUpToCap is admission without attention DP: every rank takes every
// request (Helix CP ranks hold replicas; every rank receives the same
// broadcast), up to the cap H of active requests per rank
// (Config.MaxActivePerRank, as the routers apply it under attention DP: own
// counts the same active requests, retiring ones left out). The rest waits
// in the queue in arrival order, so that a deep queue never reaches the
// scheduler, whose pass then costs what H costs (issue 24; TensorRT-LLM's
// executor likewise holds requests beyond max_num_active_requests). Every
// replica reads the same state, so every one admits the same requests.
func (e *Executor) admitUpToCap(items []Arrival, own RankState) {
	e.waiting.PushBack(items)
	n := min(e.waiting.Len(), max(0, e.cfg.MaxActivePerRank-int(own.ActiveRequests)))
	for i := range n {
		e.admit(*e.waiting.At(i), scheduler.UnsetEstimate)
	}
	e.waiting.DropFront(n)
	e.waiting.Trim()
}

// admit validates an arrival (§3.4); a request that can never run is
// rejected at once with the reason and never enters active.
func (e *Executor) admit(a Arrival, estimate int64) {
	if a.Prompt == nil && a.Synthesize != nil {
		a.Prompt = a.Synthesize()
	}
	r := newRequest(a)
	r.UncachedEstimate = estimate
	if a.Guide != "" {
		// Rank 0 compiled it before the broadcast (screenGuide); every rank
		// compiles the same pattern for the same vocabulary.
		if reason := e.screenGuide(a.Guide); reason != "" {
			e.pending = append(e.pending, Response{ID: a.ID, Rank: e.cfg.Rank, ArrivalUnixNS: a.ArrivalUnixNS,
				FinishUnixNS: e.cfg.Clock().UnixNano(), Error: reason})
			return
		}
		g, _ := e.cfg.Guides.Guide(a.Guide)
		r.guide = g.NewMatcher()
	}
	if e.cfg.Helix {
		r.TotalInputLenCP = r.PromptLen
		e.setHelixLocalLen(r)
	}
	if v := e.verdict(r); v.Code == scheduler.NeverFits {
		e.pending = append(e.pending, Response{ID: a.ID, Rank: e.cfg.Rank, ArrivalUnixNS: a.ArrivalUnixNS,
			FinishUnixNS: e.cfg.Clock().UnixNano(), Error: v.Reason})
		return
	}
	// Priority order (Arrival.Priority, lower first; arrival order among
	// equals): ahead of the less urgent requests, never ahead of a padding
	// dummy. With equal priorities it is the back.
	j := len(e.active)
	for j > 0 && !e.active[j-1].IsDummy && e.active[j-1].priority > r.priority {
		j--
	}
	e.active = slices.Insert(e.active, j, r)
	e.index(r)
}

// verdict is arrival validation on the owning rank (executor.md §3 step 4),
// against the pages this rank could allocate now. A request that fits the
// pool but not those pages (WaitForPages) is admitted like one that Fits:
// it waits in CONTEXT_INIT until the scheduler finds its pages. Only
// NeverFits is rejected, and with the same answer rank 0's screen gave.
func (e *Executor) verdict(r *request) scheduler.AdmissionVerdict {
	available := 0
	if lb := e.adm.LedgerBlockTokens; lb > 0 {
		available = e.d.KV.AvailableTokens() / lb
	}
	return e.adm.VerdictNow(r.PromptLen, r.MaxNewTokens, available)
}
