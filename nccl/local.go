package nccl

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"time"
)

// DefaultLocalTimeout is the watchdog timeout of a local group created with
// LocalOptions.Timeout = 0.
const DefaultLocalTimeout = 60 * time.Second

// LocalOptions configures an in-process group.
type LocalOptions struct {
	// Timeout is the collective watchdog: a member that waits longer than
	// this for its peers fails with ErrTimeout. 0 means DefaultLocalTimeout.
	Timeout time.Duration
}

// NewLocalGroup returns the members of an in-process group of size ranks,
// one *LocalComm per rank, each to be driven by its own goroutine.
//
// Collectives pair by call order: the k-th collective a rank enters meets the
// k-th collective of every other rank. When all members have entered call #k
// they must agree on kind and name (and op and length for AllReduce, root for
// Broadcast); otherwise every member gets an ErrMismatch error naming both
// sides, instead of the hang or garbage a real NCCL group would produce. A
// member that waits longer than the timeout fails with ErrTimeout, and a
// member that closes fails the peers waiting for it with ErrClosed. Each
// member records the collectives it entered (Trace), so tests can compare
// ranks element by element (executor.md §7).
func NewLocalGroup(size int, opts LocalOptions) []*LocalComm {
	if size <= 0 {
		panic(fmt.Sprintf("nccl: NewLocalGroup size must be positive, got %d", size))
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultLocalTimeout
	}
	g := &localGroup{
		size:    size,
		timeout: timeout,
		slots:   make(map[int]*slot),
		members: make([]*LocalComm, size),
	}
	for r := range g.members {
		g.members[r] = &LocalComm{g: g, rank: r}
	}
	return slices.Clone(g.members)
}

// localGroup is the state shared by the members; mu guards all of it,
// including every member's counters and trace.
type localGroup struct {
	mu      sync.Mutex
	size    int
	timeout time.Duration
	// slots holds the collectives that some member entered and not every
	// member has consumed yet, by call number.
	slots   map[int]*slot
	members []*LocalComm
}

// entry is one member's arguments to one collective.
type entry struct {
	TraceEntry
	op   ReduceOp // allreduce
	root int      // broadcast
	data []byte   // allgather: own data; broadcast: root's data (a private copy)
	vals []int64  // allreduce (a private copy)
}

// slot is one collective call number as the members meet in it. entries,
// finished and err are written under the group lock; once done is closed they
// never change, so members read them without the lock.
type slot struct {
	seq      int
	entries  []*entry // by rank; nil = not entered yet
	entered  int
	finished bool
	done     chan struct{}
	err      error // nil: every member entered and they matched
	consumed int   // members that returned from this call
}

// finish completes the slot with err (nil = success) and wakes its waiters.
// Caller holds the group lock.
func (s *slot) finish(err error) {
	if s.finished {
		return
	}
	s.finished, s.err = true, err
	close(s.done)
}

// LocalComm is one rank's member of a local group. It implements Comm.
// Methods other than Trace and ResetTrace are called by the rank's own
// goroutine only; Trace and ResetTrace may be called from anywhere.
type LocalComm struct {
	g      *localGroup
	rank   int
	seq    int // next call number on this rank
	closed bool
	// last is the collective this rank entered most recently (hasLast).
	last    TraceEntry
	hasLast bool
	trace   traceLog
}

var _ Comm = (*LocalComm)(nil)

// Rank is this member's index.
func (c *LocalComm) Rank() int { return c.rank }

// Size is the group size.
func (c *LocalComm) Size() int { return c.g.size }

// AllGather returns every member's data in rank order; sizes may differ. The
// result and its slices are fresh copies owned by the caller.
func (c *LocalComm) AllGather(name string, data []byte) ([][]byte, error) {
	s, err := c.enter(&entry{TraceEntry: TraceEntry{Kind: KindAllGather, Name: name}, data: bytes.Clone(data)})
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(s.entries))
	for r, e := range s.entries {
		out[r] = bytes.Clone(e.data)
	}
	return out, nil
}

// Broadcast returns a copy of root's data on every member.
func (c *LocalComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	e := &entry{TraceEntry: TraceEntry{Kind: KindBroadcast, Name: name}, root: root}
	if root == c.rank {
		e.data = bytes.Clone(data)
	}
	s, err := c.enter(e)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(s.entries[root].data), nil
}

// AllReduceInt64 reduces vals element-wise over the group; every member must
// pass the same op and length.
func (c *LocalComm) AllReduceInt64(name string, op ReduceOp, vals []int64) ([]int64, error) {
	s, err := c.enter(&entry{TraceEntry: TraceEntry{Kind: KindAllReduce, Name: name}, op: op,
		vals: slices.Clone(vals)})
	if err != nil {
		return nil, err
	}
	out := slices.Clone(s.entries[0].vals)
	for _, e := range s.entries[1:] {
		for i, v := range e.vals {
			switch op {
			case ReduceSum:
				out[i] += v
			case ReduceMin:
				out[i] = min(out[i], v)
			case ReduceMax:
				out[i] = max(out[i], v)
			}
		}
	}
	return out, nil
}

// Close leaves the group: peers waiting for this member, now or in any later
// collective it has not entered, fail with ErrClosed, and later calls on this
// member fail with ErrClosed. Idempotent.
func (c *LocalComm) Close() error {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, s := range g.slots {
		if s.entries[c.rank] == nil {
			s.finish(g.closedError(s, c.rank))
		}
	}
	return nil
}

// Trace returns a copy of the collectives this member entered since the
// last ResetTrace, in call order (including calls that failed): the last
// MaxTraceEntries of them.
func (c *LocalComm) Trace() []TraceEntry {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return c.trace.entries()
}

// ResetTrace empties the trace. Call numbers keep counting: they are what
// pairs collectives across members.
func (c *LocalComm) ResetTrace() {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	c.trace.reset()
}

// enter registers e as this member's next collective and waits until every
// member has entered it (or it fails). On success the returned slot's entries
// are complete, matched and immutable.
func (c *LocalComm) enter(e *entry) (*slot, error) {
	g := c.g
	g.mu.Lock()
	if c.closed {
		g.mu.Unlock()
		return nil, &collectiveError{kind: ErrClosed, msg: fmt.Sprintf("rank %d: %s called after Close", c.rank, quoted(e.TraceEntry))}
	}
	e.Seq = c.seq
	c.seq++
	c.trace.add(e.TraceEntry)
	c.last, c.hasLast = e.TraceEntry, true
	s := g.slots[e.Seq]
	if s == nil {
		s = &slot{seq: e.Seq, entries: make([]*entry, g.size), done: make(chan struct{})}
		g.slots[e.Seq] = s
	}
	if !s.finished { // a finished slot failed before we arrived; share its error
		s.entries[c.rank] = e
		s.entered++
		if s.entered == g.size {
			s.finish(g.matchError(s))
		} else if r := g.closedAbsentee(s); r >= 0 {
			s.finish(g.closedError(s, r))
		}
	}
	g.mu.Unlock()

	select {
	case <-s.done:
	default:
		timer := time.NewTimer(g.timeout)
		select {
		case <-s.done:
		case <-timer.C:
			g.mu.Lock()
			s.finish(g.timeoutError(s, c.rank))
			g.mu.Unlock()
		}
		timer.Stop()
	}

	g.mu.Lock()
	s.consumed++
	if s.consumed == g.size {
		delete(g.slots, s.seq)
	}
	g.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}
