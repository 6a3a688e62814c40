// Package nccl holds the collective layer the ranks meet in every iteration:
// the Comm interface, the in-process goroutine group used by tests and
// simulation, and (later) the native MPI/NCCL communicators, rank detection,
// the bootstrap store and the collective watchdog (DESIGN.md §5).
package nccl

import (
	"errors"
	"fmt"
	"time"
)

// ReduceOp is an AllReduce operation.
type ReduceOp int

// Reduce operations.
const (
	ReduceSum ReduceOp = iota
	ReduceMin
	ReduceMax
)

// String names the operation.
func (o ReduceOp) String() string {
	switch o {
	case ReduceSum:
		return "sum"
	case ReduceMin:
		return "min"
	case ReduceMax:
		return "max"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Kind is a collective's kind.
type Kind string

// Collective kinds.
const (
	KindAllGather Kind = "allgather"
	KindBroadcast Kind = "broadcast"
	KindAllReduce Kind = "allreduce"
)

// IdleWaiter is a Comm or Transport whose waits in a collective hold the
// CPU: MPI's blocking collectives poll their transports until the last
// member arrives. Before a collective that may be far off (the first of an
// idle fleet's next iteration, which rank 0 starts only when a request comes
// or its idle sleep ends) every member calls IdleWait at the same point of
// its program, as it would a collective: root returns at once, having rung
// the others, who wait for that ring asleep, for at most timeout, and then
// go on into the collective; they look for the ring every poll (the most it
// can add to the collective that follows). Nothing is exchanged and a late
// ring is harmless (the next call drops it), so a timeout costs only CPU. A
// Comm that wraps another forwards the call when the inner one implements it
// and returns nil otherwise.
type IdleWaiter interface {
	IdleWait(root int, poll, timeout time.Duration) error
}

// Comm is one rank's handle on a group. Every member must enter the same
// collectives in the same order (executor.md §7); name labels the program
// point ("rank_state", "batch_size", ...) so that a mismatch can be reported.
// Implementations are used by one goroutine per rank.
type Comm interface {
	// Rank is this member's index in the group; Size the group size.
	Rank() int
	Size() int
	// AllGather returns every member's data, in rank order. Sizes may differ.
	// The returned slices are owned by the caller. No implementation keeps
	// data (nor Broadcast's, nor vals) past the call: callers reuse their
	// buffers.
	AllGather(name string, data []byte) ([][]byte, error)
	// Broadcast returns root's data on every member (data is ignored off root).
	Broadcast(name string, root int, data []byte) ([]byte, error)
	// AllReduceInt64 reduces vals element-wise over the group. Every member
	// must pass the same length.
	AllReduceInt64(name string, op ReduceOp, vals []int64) ([]int64, error)
	// Close leaves the group; peers blocked on this member fail.
	Close() error
}

// SharedGatherer is implemented by in-process groups whose members can share
// one decoded result of an allgather (CoroComm): decode runs once for the
// whole group and every member receives its (read-only) result. Callers
// fall back to AllGather and their own decode on other communicators.
type SharedGatherer interface {
	AllGatherDecoded(name string, data []byte, decode func([][]byte) (any, error)) (any, error)
	// Shared returns the group's one value under key, made by the first
	// member that asks (create runs once per group and key): state the
	// members share outside the collectives, e.g. result slots each member
	// fills with its own part before it enters a collective.
	Shared(key string, create func() any) any
}

// TraceEntry is one collective as a rank entered it.
type TraceEntry struct {
	Seq  int    // 0-based call number on this rank
	Kind Kind   // allgather, broadcast, allreduce
	Name string // program point
}

// String renders the entry as "kind:name".
func (e TraceEntry) String() string { return string(e.Kind) + ":" + e.Name }

// Sentinel errors of the collective layer; match with errors.Is.
var (
	// ErrMismatch: the members entered different collectives at the same call.
	ErrMismatch = errors.New("collective mismatch")
	// ErrTimeout: the watchdog fired before every member arrived.
	ErrTimeout = errors.New("collective timeout")
	// ErrClosed: the group (or a peer) was closed.
	ErrClosed = errors.New("communicator closed")
)
