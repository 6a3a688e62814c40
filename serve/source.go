// Package serve is lockstep's online face on rank 0: an OpenAI-compatible
// HTTP API whose requests enter the executor's arrival collective (so every
// rank sees the same arrivals in the same order) and whose answers come back
// through the executor's response gathers, Prometheus metrics, and the
// client side used by `worker loadgen`.
package serve

import (
	"sync"
	"time"

	"github.com/lockstep-ai/lockstep/executor"
)

// source is the executor.Source of a server: requests queued by HTTP
// handlers, handed to rank 0's loop at its next intake, and withdrawn
// (executor.Canceller) when their client goes away.
type source struct {
	mu      sync.Mutex
	queue   []executor.Arrival
	handed  map[uint64]bool // ids handed to the loop before the last intake, not finished
	just    []uint64        // ids handed out by the current intake's Due
	cancels []uint64        // withdrawn ids to announce at the next intake
	later   []uint64        // withdrawn ids of the current intake: announced at the one after
	closed  bool            // no more arrivals (drain finished)
	// idleWake is how long an idle loop waits before it looks again when
	// nothing comes (WaitArrival returns at once when something does);
	// wake carries that news (buffered: a signal sent while the loop is
	// busy is not lost).
	idleWake time.Duration
	wake     chan struct{}
}

// serverIdleWake paces an idle server's fleet: one iteration every 20 ms
// keeps /health's progress check and the gauges current, and a request
// wakes the loop at once. (It looked every millisecond before, which kept
// an idle 2-rank server at ~11 % of a core.)
const serverIdleWake = 20 * time.Millisecond

func newSource() *source {
	return &source{handed: map[uint64]bool{}, idleWake: serverIdleWake, wake: make(chan struct{}, 1)}
}

// signal wakes an idle loop (WaitArrival); callers hold s.mu or not, it
// never blocks.
func (s *source) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// WaitArrival implements executor.ArrivalWaiter: it returns when a request
// or a withdrawal is waiting for the loop, the source is closed, or after d.
func (s *source) WaitArrival(d time.Duration) {
	select { // a signal already consumed by this check's state is stale
	case <-s.wake:
	default:
	}
	s.mu.Lock()
	ready := len(s.queue) > 0 || len(s.cancels) > 0 || len(s.later) > 0 || s.closed
	s.mu.Unlock()
	if ready {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.wake:
	case <-t.C:
	}
}

// push queues an arrival; false once the source is closed.
func (s *source) push(a executor.Arrival) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.queue = append(s.queue, a)
	s.signal()
	return true
}

// cancel withdraws id: dropped from the queue if the loop has not taken it
// yet, or already finished (true: no answer will come), else announced to
// the ranks at the next intake (false: their answer will come).
func (s *source) cancel(id uint64) (gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range s.queue {
		if a.ID == id {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return true
		}
	}
	if s.handed[id] {
		s.cancels = append(s.cancels, id)
		s.signal()
		return false
	}
	for _, j := range s.just {
		if j == id {
			s.later = append(s.later, id)
			s.signal()
			return false
		}
	}
	return true
}

// finished forgets id (its answer arrived).
func (s *source) finished(id uint64) {
	s.mu.Lock()
	delete(s.handed, id)
	s.mu.Unlock()
}

// close ends the source: the loop exits once its work is done.
func (s *source) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.signal()
}

// isClosed reports whether close was called.
func (s *source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Due implements executor.Source.
func (s *source) Due(time.Time) []executor.Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	out := s.queue
	s.queue = nil
	for _, a := range out {
		s.just = append(s.just, a.ID)
	}
	return out
}

// Cancelled implements executor.Canceller. Due runs first in an intake:
// the ids it just handed out are known to the ranks only after this
// intake, so their withdrawals wait for the next one.
func (s *source) Cancelled() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.cancels
	s.cancels, s.later = s.later, nil
	for _, id := range s.just {
		s.handed[id] = true
	}
	s.just = s.just[:0]
	return out
}

// Exhausted implements executor.Source.
func (s *source) Exhausted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed && len(s.queue) == 0
}

// NextArrival implements executor.Source: requests can come at any time, so
// an idle loop looks again after idleWake, unless WaitArrival wakes it
// sooner.
func (s *source) NextArrival() time.Time { return time.Now().Add(s.idleWake) }

// Total implements executor.Source (unknown for a server).
func (s *source) Total() int { return 0 }
