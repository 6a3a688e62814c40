package goengine

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Queue holds the results of submitted steps, oldest first, for an engine
// that computes a step when it is submitted: indistinguishable from a
// stream that runs steps in submit order. T is what Wait needs of a step
// (its bridge.StepResult, and whatever else the engine reports).
//
// The messages match the native engine's (eng_engine_submit, _wait, _step):
// at most bridge.MaxInflight steps outstanding, no Step while any is, no
// Wait without one. The zero Queue is empty and ready.
type Queue[T any] struct {
	slots   [bridge.MaxInflight]T // a ring: slot arrays are reused
	head, n int
}

// Len is the number of submitted steps not yet waited for.
func (q *Queue[T]) Len() int { return q.n }

// RequireIdle is Step's precondition: an INVALID_ARGUMENT error of op when
// submitted steps have not been waited for (Step is ordered after them and
// would overtake them).
func (q *Queue[T]) RequireIdle(op string) error {
	if q.n > 0 {
		return Invalid(op, "%d submitted steps have not been waited for", q.n)
	}
	return nil
}

// Next returns the slot the next submitted step's result is written into,
// or an INVALID_ARGUMENT error of op when bridge.MaxInflight steps are
// outstanding. The slot still holds an older step's values (reuse its
// slices); it joins the queue only at Push, so a step that fails
// validation is never queued.
func (q *Queue[T]) Next(op string) (*T, error) {
	if q.n >= bridge.MaxInflight {
		return nil, Invalid(op, "%d steps are already in flight", q.n)
	}
	return &q.slots[(q.head+q.n)%bridge.MaxInflight], nil
}

// Push queues the slot Next returned. It panics when the queue is full
// (Push without a successful Next).
func (q *Queue[T]) Push() {
	if q.n >= bridge.MaxInflight {
		panic("goengine.Queue: Push on a full queue (Push without Next)")
	}
	q.n++
}

// Pop removes the oldest submitted step and returns its slot, or an
// INVALID_ARGUMENT error of op when none is queued. The slot stays valid
// until the next Next.
func (q *Queue[T]) Pop(op string) (*T, error) {
	if q.n == 0 {
		return nil, Invalid(op, "no submitted step to wait for")
	}
	s := &q.slots[q.head]
	q.head = (q.head + 1) % bridge.MaxInflight
	q.n--
	return s, nil
}

// Invalid builds an INVALID_ARGUMENT error of op.
func Invalid(op, format string, args ...any) error {
	return bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf(format, args...))
}
