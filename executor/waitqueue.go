package executor

import (
	"cmp"
	"slices"
)

// waitQueue is the router's waiting queue (received, not routed yet;
// identical on every rank): a ring buffer read from its head, so that a
// routing call touches only the arrivals it examines (issue 24: the queue
// used to be copied whole on every iteration). Arrivals join at the back;
// a pop takes a prefix off the front and may put some of it back there, in
// order. A slot left is cleared, so that popped prompts can be collected.
type waitQueue struct {
	buf  []Arrival // len(buf) is 0 or a power of two
	head int       // index of the first arrival in buf
	n    int       // arrivals queued
	// ids holds the queued arrivals' ids: a cancellation asks every rank
	// whether an id it does not hold is queued (Has), which must not cost
	// a walk over a deep queue.
	ids map[uint64]struct{}
}

// Has reports whether an arrival with this id is queued.
func (q *waitQueue) Has(id uint64) bool {
	_, ok := q.ids[id]
	return ok
}

func (q *waitQueue) index(a *Arrival) {
	if q.ids == nil {
		q.ids = make(map[uint64]struct{})
	}
	q.ids[a.ID] = struct{}{}
}

// Len is the number of queued arrivals.
func (q *waitQueue) Len() int { return q.n }

// At returns the i-th queued arrival from the front (0 ≤ i < Len).
func (q *waitQueue) At(i int) *Arrival {
	if i < 0 || i >= q.n {
		panic("executor: waitQueue index out of range")
	}
	return &q.buf[(q.head+i)&(len(q.buf)-1)]
}

// PushBack queues arrivals in order, each behind every queued arrival of
// its priority or a more urgent one (Arrival.Priority, lower first): at
// the back when priorities are equal (first come, first served), ahead of
// the less urgent ones otherwise. One merge from the back per call: only
// the queued arrivals less urgent than some new one move, once.
func (q *waitQueue) PushBack(items []Arrival) {
	if len(items) == 0 {
		return
	}
	if !slices.IsSortedFunc(items, byPriority) {
		items = slices.Clone(items)
		slices.SortStableFunc(items, byPriority)
	}
	q.reserve(q.n + len(items))
	i, w := q.n-1, q.n+len(items)-1
	for j := len(items) - 1; j >= 0; w-- {
		if i >= 0 && q.At(i).Priority > items[j].Priority {
			q.buf[(q.head+w)&(len(q.buf)-1)] = *q.At(i)
			i--
			continue
		}
		q.buf[(q.head+w)&(len(q.buf)-1)] = items[j]
		q.index(&items[j])
		j--
	}
	q.n += len(items)
}

func byPriority(a, b Arrival) int { return cmp.Compare(a.Priority, b.Priority) }

// DropFront removes the first k arrivals.
func (q *waitQueue) DropFront(k int) {
	if k < 0 || k > q.n {
		panic("executor: waitQueue.DropFront beyond the queue")
	}
	for range k {
		delete(q.ids, q.buf[q.head].ID)
		q.buf[q.head] = Arrival{}
		q.head = (q.head + 1) & (len(q.buf) - 1)
	}
	q.n -= k
}

// maxKeptSlots is the largest ring an empty queue keeps: a burst deeper
// than this gives its ring (and its id index) back once it has drained,
// since every rank holds the queue and in-process ranks hold it once each.
const maxKeptSlots = 1024

// Trim gives back an empty queue's storage when a burst grew it beyond
// maxKeptSlots.
func (q *waitQueue) Trim() {
	if q.n == 0 && len(q.buf) > maxKeptSlots {
		q.buf, q.head, q.ids = nil, 0, nil
	}
}

// PushFront puts items back at the front, in order (items[0] first).
func (q *waitQueue) PushFront(items []Arrival) {
	q.reserve(q.n + len(items))
	for i := len(items) - 1; i >= 0; i-- {
		q.head = (q.head - 1) & (len(q.buf) - 1)
		q.buf[q.head] = items[i]
		q.index(&items[i])
		q.n++
	}
}

// Remove takes out, keeping the others' order, the arrivals for which drop
// is true, and passes each to drop's caller in queue order through the
// returned slice (appended to out). One pass over the queue.
func (q *waitQueue) Remove(drop func(*Arrival) bool, out []Arrival) []Arrival {
	w := 0
	for i := 0; i < q.n; i++ {
		a := q.At(i)
		if drop(a) {
			delete(q.ids, a.ID)
			out = append(out, *a)
			continue
		}
		if w != i {
			*q.At(w) = *a
		}
		w++
	}
	for i := w; i < q.n; i++ {
		*q.At(i) = Arrival{}
	}
	q.n = w
	return out
}

// reserve grows the ring to hold n arrivals, keeping their order.
func (q *waitQueue) reserve(n int) {
	if n <= len(q.buf) {
		return
	}
	size := max(16, len(q.buf))
	for size < n {
		size *= 2
	}
	buf := make([]Arrival, size)
	for i := 0; i < q.n; i++ {
		buf[i] = q.buf[(q.head+i)&(len(q.buf)-1)]
	}
	q.buf, q.head = buf, 0
}
