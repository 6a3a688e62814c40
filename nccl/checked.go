package nccl

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// Transport moves bytes between the processes of one group. It has a single
// primitive, a variable-size allgather; CheckedComm builds every collective
// of Comm on it, so the MPI and TCP transports share one protocol and one
// mismatch check.
//
// Contract: calls pair by order (the k-th call of every member meets the k-th
// call of every other member); AllGatherBytes returns every member's payload
// in rank order, in slices owned by the caller; after an error the transport
// is unusable (the members may no longer be paired). Close may be called from
// another goroutine while AllGatherBytes blocks; a transport that can unblock
// the call (TCP) does so, one that cannot (MPI) documents it.
type Transport interface {
	// Rank is this member's index in the group; Size the group size.
	Rank() int
	Size() int
	// AllGatherBytes contributes payload and returns every member's payload.
	AllGatherBytes(payload []byte) ([][]byte, error)
	// Close leaves the group.
	Close() error
}

// CheckedComm implements Comm over a Transport with the robust protocol:
// every collective is exactly one AllGatherBytes whose per-rank payload starts
// with a header (call number, kind, name, and the op and length of an
// AllReduce or the root of a Broadcast). After each exchange every member
// compares all headers with rank 0's, in rank order, and reports the first
// difference as an ErrMismatch error naming both sides. Every member sees the
// same headers, so every member reports the same error at the same call:
// a desynchronised program fails loudly instead of pairing unrelated data or
// hanging (a rank that never arrives is the watchdog's job).
//
// Argument checks that depend on one rank's arguments (a broadcast root out
// of range, an unknown reduce op) are made after the exchange too, so that
// no member ever returns without entering the transport while its peers wait.
//
// Methods other than Trace, ResetTrace and Close are called by the rank's
// own goroutine only.
type CheckedComm struct {
	t    Transport
	rank int
	size int

	mu     sync.Mutex // guards the fields below (Trace may run anywhere)
	seq    int        // next call number
	trace  traceLog
	broken error // set by a transport failure or Close; returned by later calls
	closed bool
}

var (
	_ Comm       = (*CheckedComm)(nil)
	_ IdleWaiter = (*CheckedComm)(nil)
)

// NewCheckedComm returns a Comm over t. The comm owns t: Close closes it.
func NewCheckedComm(t Transport) *CheckedComm {
	return &CheckedComm{t: t, rank: t.Rank(), size: t.Size()}
}

// Rank is this member's index.
func (c *CheckedComm) Rank() int { return c.rank }

// Size is the group size.
func (c *CheckedComm) Size() int { return c.size }

// AllGather returns every member's data in rank order; sizes may differ.
func (c *CheckedComm) AllGather(name string, data []byte) ([][]byte, error) {
	h := header{Kind: KindAllGather, Name: name}
	got, err := c.exchange(&h, data)
	if err != nil {
		return nil, err
	}
	return got, nil
}

// Broadcast returns root's data on every member. Only the root sends its
// data; the others send the header alone.
func (c *CheckedComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	h := header{Kind: KindBroadcast, Name: name, Root: int64(root)}
	if root != c.rank {
		data = nil
	}
	got, err := c.exchange(&h, data)
	if err != nil {
		return nil, err
	}
	return got[root], nil
}

// AllReduceInt64 gathers every member's vector and reduces it locally in
// rank order, so the result is bit-identical on every member.
func (c *CheckedComm) AllReduceInt64(name string, op ReduceOp, vals []int64) ([]int64, error) {
	h := header{Kind: KindAllReduce, Name: name, Op: op, Len: int64(len(vals))}
	body := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(body[8*i:], uint64(v))
	}
	got, err := c.exchange(&h, body)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(vals))
	for r, b := range got {
		for i := range out {
			v := int64(binary.LittleEndian.Uint64(b[8*i:]))
			switch {
			case r == 0:
				out[i] = v
			case op == ReduceSum:
				out[i] += v
			case op == ReduceMin:
				out[i] = min(out[i], v)
			case op == ReduceMax:
				out[i] = max(out[i], v)
			}
		}
	}
	return out, nil
}

// IdleWait forwards to the transport when it is an IdleWaiter (MPI) and
// returns at once otherwise (a TCP transport's waits sleep in the kernel).
// It is not a collective: nothing is numbered, traced or checked.
func (c *CheckedComm) IdleWait(root int, poll, timeout time.Duration) error {
	w, ok := c.t.(IdleWaiter)
	if !ok {
		return nil
	}
	c.mu.Lock()
	err := c.broken
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return w.IdleWait(root, poll, timeout)
}

// Close closes the transport; later calls fail with ErrClosed. Idempotent.
func (c *CheckedComm) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	if c.broken == nil {
		c.broken = errCheckedClosed
	}
	c.mu.Unlock()
	if already {
		return nil
	}
	return c.t.Close()
}

// errCheckedClosed is what calls after Close return.
var errCheckedClosed = &collectiveError{kind: ErrClosed, msg: "communicator closed"}

// Trace returns a copy of the collectives this member entered since the last
// ResetTrace, in call order (including calls that failed): the last
// MaxTraceEntries of them.
func (c *CheckedComm) Trace() []TraceEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trace.entries()
}

// ResetTrace empties the trace; call numbers keep counting.
func (c *CheckedComm) ResetTrace() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trace.reset()
}

// exchange runs one collective: it numbers and records it, sends header+body
// through the transport, validates every member's header and returns the
// bodies in rank order.
func (c *CheckedComm) exchange(h *header, body []byte) ([][]byte, error) {
	c.mu.Lock()
	if err := c.broken; err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("rank %d: %s: %w", c.rank, quoted(h.entry()), err)
	}
	h.Seq = int64(c.seq)
	c.seq++
	c.trace.add(h.entry())
	c.mu.Unlock()

	got, err := c.t.AllGatherBytes(append(h.encode(), body...))
	if err != nil {
		err = fmt.Errorf("collective #%d %s on rank %d: %w", h.Seq, quoted(h.entry()), c.rank, err)
		c.mu.Lock()
		if c.broken == nil {
			c.broken = err
		}
		c.mu.Unlock()
		return nil, err
	}
	if len(got) != c.size {
		panic(fmt.Sprintf("nccl: transport invariant: AllGatherBytes returned %d payloads for %d ranks", len(got), c.size))
	}
	hdrs := make([]header, c.size)
	bodies := make([][]byte, c.size)
	for r, p := range got {
		n, err := hdrs[r].decode(p)
		if err != nil {
			return nil, &collectiveError{kind: ErrMismatch, msg: fmt.Sprintf(
				"collective #%d: rank %d sent a payload that is not a collective header (%v); is every rank running the same program?",
				h.Seq, r, err)}
		}
		bodies[r] = p[n:]
	}
	if err := checkHeaders(hdrs, bodies, c.size); err != nil {
		return nil, err
	}
	return bodies, nil
}

// checkHeaders compares every member's header with rank 0's (the first
// difference in rank order is reported, so every member reports the same
// pair), then validates the agreed arguments.
func checkHeaders(hdrs []header, bodies [][]byte, size int) error {
	ref := &hdrs[0]
	for r := 1; r < size; r++ {
		h := &hdrs[r]
		detailed := false
		switch {
		case h.Kind != ref.Kind || h.Name != ref.Name || h.Seq != ref.Seq:
		case h.Kind == KindAllReduce && (h.Op != ref.Op || h.Len != ref.Len):
			detailed = true
		case h.Kind == KindBroadcast && h.Root != ref.Root:
			detailed = true
		default:
			continue
		}
		return &collectiveError{kind: ErrMismatch, msg: fmt.Sprintf(
			"collective #%d mismatch: rank 0 entered %s, rank %d entered %s",
			ref.Seq, ref.describe(detailed, h.Seq != ref.Seq), r, h.describe(detailed, h.Seq != ref.Seq))}
	}
	switch ref.Kind {
	case KindBroadcast:
		if ref.Root < 0 || ref.Root >= int64(size) {
			return &collectiveError{msg: fmt.Sprintf("collective #%d %s: root %d outside the group [0, %d)",
				ref.Seq, quoted(ref.entry()), ref.Root, size)}
		}
	case KindAllReduce:
		if ref.Op < ReduceSum || ref.Op > ReduceMax {
			return &collectiveError{msg: fmt.Sprintf("collective #%d %s: unknown reduce %s",
				ref.Seq, quoted(ref.entry()), ref.Op)}
		}
		for r, b := range bodies {
			// Divided, not multiplied: 8*Len overflows for a Len from a
			// corrupt header, and a wrapped product could match.
			if ref.Len < 0 || len(b)%8 != 0 || int64(len(b)/8) != ref.Len {
				return &collectiveError{kind: ErrMismatch, msg: fmt.Sprintf(
					"collective #%d %s: rank %d sent %d bytes for %d int64 values",
					ref.Seq, quoted(ref.entry()), r, len(b), ref.Len)}
			}
		}
	}
	return nil
}

// header is the prefix of every payload CheckedComm sends: what the rank
// believes this collective is.
type header struct {
	Seq  int64
	Kind Kind
	Name string
	Op   ReduceOp // allreduce
	Len  int64    // allreduce: number of int64 values
	Root int64    // broadcast
}

// Wire format (little-endian): magic u16, seq i64, kind u8, op u8, len i64,
// root i64, name length u32, name bytes. Fixed fields first so that a peer
// running a different program is recognised by the magic.
const (
	headerMagic = 0x4c53 // "LS"
	headerFixed = 2 + 8 + 1 + 1 + 8 + 8 + 4
)

var kindCodes = map[Kind]byte{KindAllGather: 1, KindBroadcast: 2, KindAllReduce: 3}

// encode renders the header; the caller appends the body.
func (h *header) encode() []byte {
	b := make([]byte, headerFixed, headerFixed+len(h.Name))
	binary.LittleEndian.PutUint16(b[0:], headerMagic)
	binary.LittleEndian.PutUint64(b[2:], uint64(h.Seq))
	b[10] = kindCodes[h.Kind]
	b[11] = byte(h.Op)
	binary.LittleEndian.PutUint64(b[12:], uint64(h.Len))
	binary.LittleEndian.PutUint64(b[20:], uint64(h.Root))
	binary.LittleEndian.PutUint32(b[28:], uint32(len(h.Name)))
	return append(b, h.Name...)
}

// decode parses a header from the start of p and returns its length.
func (h *header) decode(p []byte) (int, error) {
	if len(p) < headerFixed || binary.LittleEndian.Uint16(p) != headerMagic {
		return 0, fmt.Errorf("%d bytes without the header magic", len(p))
	}
	h.Seq = int64(binary.LittleEndian.Uint64(p[2:]))
	h.Kind = ""
	for k, code := range kindCodes {
		if code == p[10] {
			h.Kind = k
		}
	}
	if h.Kind == "" {
		return 0, fmt.Errorf("unknown collective kind code %d", p[10])
	}
	h.Op = ReduceOp(p[11])
	h.Len = int64(binary.LittleEndian.Uint64(p[12:]))
	h.Root = int64(binary.LittleEndian.Uint64(p[20:]))
	// Compared as uint64: converted to int first, a length of 2³¹ or more
	// would be negative on 32-bit platforms and pass the check.
	n := binary.LittleEndian.Uint32(p[28:])
	if uint64(n) > uint64(len(p)-headerFixed) {
		return 0, fmt.Errorf("name length %d beyond the %d-byte payload", n, len(p))
	}
	h.Name = string(p[headerFixed : headerFixed+int(n)])
	return headerFixed + int(n), nil
}

// entry is the header as a trace entry.
func (h *header) entry() TraceEntry {
	return TraceEntry{Seq: int(h.Seq), Kind: h.Kind, Name: h.Name}
}

// describe renders the header like the local group's entries: kind:"name",
// with op and length (allreduce) or root (broadcast) when detailed, and the
// call number when the members disagree on it.
func (h *header) describe(detailed, withSeq bool) string {
	s := quoted(h.entry())
	if detailed {
		switch h.Kind {
		case KindAllReduce:
			s = fmt.Sprintf("%s(%s, len %d)", s, h.Op, h.Len)
		case KindBroadcast:
			s = fmt.Sprintf("%s(root %d)", s, h.Root)
		}
	}
	if withSeq {
		s = fmt.Sprintf("%s as its call #%d", s, h.Seq)
	}
	return s
}
