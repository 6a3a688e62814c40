package kvpool

// Publication of KV cache events (kvcache.md §9.4), the pure part: the
// bounded deque of published events with its drop counter. The executor
// owns the collectives (the allgather under attention-DP) and the waiting
// of GetLatestEvents; this type has no locking, so the executor guards it.

// LastEvents returns the last max entries of evs (all of them when
// max ≤ 0 or len(evs) ≤ max) and how many were cut: "keep only the last
// max entries" of FlushIterationEvents before publication.
func LastEvents(evs []Event, max int) (kept []Event, cut int) {
	if max <= 0 || len(evs) <= max {
		return evs, 0
	}
	return evs[len(evs)-max:], len(evs) - max
}

// EventPublisher is the published-event deque: capacity max (max·dp under
// attention-DP); publishing beyond it drops the oldest entries and counts
// them (events_dropped). Only the publishing rank has one: global rank 0
// without attention-DP, attention-DP rank 0 with it.
type EventPublisher struct {
	max, dp   int
	published []Event
	dropped   uint64
}

// NewEventPublisher builds a deque for event_buffer_max_size max and dp
// attention-DP ranks (dp ≤ 1 without attention-DP).
func NewEventPublisher(max, dp int) *EventPublisher {
	return &EventPublisher{max: max, dp: dp}
}

// Capacity is max·dp (max without attention-DP).
func (p *EventPublisher) Capacity() int { return p.max * max(1, p.dp) }

// Publish appends one flush: perRank[r] is rank r's list as gathered (one
// list without attention-DP). Each rank contributes its last max entries,
// in rank order; the oldest entries beyond the capacity are dropped and
// counted. The cut of LastEvents is not counted here (the flushing rank
// knows it).
func (p *EventPublisher) Publish(perRank ...[]Event) {
	for _, evs := range perRank {
		kept, _ := LastEvents(evs, p.max)
		p.published = append(p.published, kept...)
	}
	if over := len(p.published) - p.Capacity(); over > 0 {
		p.dropped += uint64(over)
		n := copy(p.published, p.published[over:])
		clear(p.published[n:])
		p.published = p.published[:n]
	}
}

// Len is the number of published events not yet taken.
func (p *EventPublisher) Len() int { return len(p.published) }

// Take returns everything published and clears the deque
// (GetLatestEvents after its wait).
func (p *EventPublisher) Take() []Event {
	out := p.published
	p.published = nil
	return out
}

// Dropped is the number of published entries dropped as oldest so far.
func (p *EventPublisher) Dropped() uint64 { return p.dropped }
