package nccl

import (
	"fmt"
	"strings"
)

// This file turns a broken collective into an error a person can act on:
// which call, which program point, and what every member was doing.

// closedAbsentee returns a closed member that has not entered s (it never
// will), or -1. Caller holds the lock.
func (g *localGroup) closedAbsentee(s *slot) int {
	for r, m := range g.members {
		if m.closed && s.entries[r] == nil {
			return r
		}
	}
	return -1
}

// matchError compares every member's entry with rank 0's; the first
// difference becomes an ErrMismatch naming both sides. It also rejects a
// broadcast root outside the group. Caller holds the lock.
func (g *localGroup) matchError(s *slot) error {
	ref := s.entries[0]
	for r, e := range s.entries[1:] {
		r++
		detailed := false
		switch {
		case e.Kind != ref.Kind || e.Name != ref.Name:
		case e.Kind == KindAllReduce && (e.op != ref.op || len(e.vals) != len(ref.vals)):
			detailed = true
		case e.Kind == KindBroadcast && e.root != ref.root:
			detailed = true
		default:
			continue
		}
		return &collectiveError{kind: ErrMismatch, msg: fmt.Sprintf(
			"collective #%d mismatch: rank 0 entered %s, rank %d entered %s",
			s.seq, ref.describe(detailed), r, e.describe(detailed))}
	}
	if ref.Kind == KindBroadcast && (ref.root < 0 || ref.root >= g.size) {
		return &collectiveError{msg: fmt.Sprintf("collective #%d %s: root %d outside the group [0, %d)",
			s.seq, quoted(ref.TraceEntry), ref.root, g.size)}
	}
	if ref.Kind == KindAllReduce && (ref.op < ReduceSum || ref.op > ReduceMax) {
		return &collectiveError{msg: fmt.Sprintf("collective #%d %s: unknown reduce %s",
			s.seq, quoted(ref.TraceEntry), ref.op)}
	}
	return nil
}

// timeoutError reports the watchdog firing on rank waiter: which collective,
// which call number, and what every member last entered. Caller holds the lock.
func (g *localGroup) timeoutError(s *slot, waiter int) error {
	e := s.entries[waiter]
	return &collectiveError{kind: ErrTimeout, msg: fmt.Sprintf(
		"collective #%d %s timed out after %v on rank %d: %s",
		s.seq, quoted(e.TraceEntry), g.timeout, waiter, g.peerReport(s))}
}

// closedError reports that member closed before entering s. Caller holds the lock.
func (g *localGroup) closedError(s *slot, closed int) error {
	return &collectiveError{kind: ErrClosed, msg: fmt.Sprintf(
		"collective #%d: rank %d closed before entering it: %s", s.seq, closed, g.peerReport(s))}
}

// peerReport lists, for every member, what it entered at s or last entered
// before it. Caller holds the lock.
func (g *localGroup) peerReport(s *slot) string {
	parts := make([]string, g.size)
	for r, m := range g.members {
		switch {
		case s.entries[r] != nil:
			parts[r] = fmt.Sprintf("rank %d entered %s (#%d)", r, quoted(s.entries[r].TraceEntry), s.seq)
		case m.hasLast:
			parts[r] = fmt.Sprintf("rank %d last entered %s (#%d)", r, quoted(m.last), m.last.Seq)
		default:
			parts[r] = fmt.Sprintf("rank %d entered nothing yet", r)
		}
		if m.closed {
			parts[r] += " and closed"
		}
	}
	return strings.Join(parts, ", ")
}

// describe renders an entry as kind:"name", with op and length (allreduce)
// or root (broadcast) when detailed.
func (e *entry) describe(detailed bool) string {
	s := quoted(e.TraceEntry)
	if !detailed {
		return s
	}
	switch e.Kind {
	case KindAllReduce:
		return fmt.Sprintf("%s(%s, len %d)", s, e.op, len(e.vals))
	case KindBroadcast:
		return fmt.Sprintf("%s(root %d)", s, e.root)
	}
	return s
}

// quoted renders a trace entry as kind:"name" for error messages (names
// may be empty or contain spaces).
func quoted(t TraceEntry) string { return fmt.Sprintf("%s:%q", t.Kind, t.Name) }

// collectiveError is a failed collective: a readable message and the
// sentinel (ErrMismatch, ErrTimeout, ErrClosed; nil for none) it wraps.
type collectiveError struct {
	msg  string
	kind error
}

func (e *collectiveError) Error() string { return e.msg }
func (e *collectiveError) Unwrap() error { return e.kind }
