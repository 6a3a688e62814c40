package nccl

import (
	"errors"
	"fmt"
	"iter"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// A coroutine group runs every member of an in-process group as a coroutine
// of one driving goroutine: a member runs until it enters a collective (or
// returns), then the driver resumes the next member; once every member has
// entered the collective, the driver checks that they match, computes the
// result once and resumes them in rank order. Only one member runs at any
// moment, so a collective costs a handful of coroutine switches instead of
// waking one goroutine per member, and execution is deterministic.
//
// This is what makes fleets of 8 to 64 simulated ranks (the digital twin)
// affordable on a 2-core machine; LocalGroup stays the model of real
// concurrency (one goroutine per rank, a watchdog, per-member traces).
//
// Results are shared: the slices AllGather and Broadcast return are the same
// backing arrays on every member and must be treated as read-only. An
// AllGather's result is valid until the caller's next collective returns:
// each member's payload and the result's slice headers are kept in two
// buffers used in turn, so a steady fleet gathers without allocating (a
// member can be at most one collective ahead of any other, so the buffer of
// collective k is reused at k+2, after every member finished with k).
// Broadcast results stay valid (each allocates its own).

// CoroGroup is an in-process group of coroutine members; see RunCoroutines.
type CoroGroup struct {
	members []*CoroComm
	// outs are the AllGather results, used in turn: member r writes its
	// payload into outs[seq&1][r] itself as it enters (on its own worker).
	outs [2][][]byte
	// rounds holds each driver's account of its members at the end of the
	// round (coroRound), for complete; res is the completed collective's
	// result, which each member reads back as it resumes.
	rounds []coroRound
	res    coroResult
	// trace records the collectives of member 0 when tracing is on.
	tracing bool
	trace   []TraceEntry
	calls   int
	// shared holds Shared's values (members ask from several threads).
	sharedMu sync.Mutex
	shared   map[string]any
}

// NewCoroGroup returns a group of size members. With trace on, Trace reports
// the collectives entered (identical on every member by construction, or the
// run fails with a mismatch).
func NewCoroGroup(size int, trace bool) *CoroGroup {
	if size <= 0 {
		panic(fmt.Sprintf("nccl: NewCoroGroup size must be positive, got %d", size))
	}
	g := &CoroGroup{members: make([]*CoroComm, size), tracing: trace}
	g.outs[0], g.outs[1] = make([][]byte, size), make([][]byte, size)
	for r := range g.members {
		g.members[r] = &CoroComm{g: g, rank: r}
	}
	return g
}

// Member returns rank r's communicator.
func (g *CoroGroup) Member(r int) *CoroComm { return g.members[r] }

// Calls is the number of collectives the group completed.
func (g *CoroGroup) Calls() int { return g.calls }

// Trace returns the collectives entered so far (when tracing is on).
func (g *CoroGroup) Trace() []TraceEntry { return slices.Clone(g.trace) }

// coroCall is one member's arguments to its pending collective.
type coroCall struct {
	kind   Kind
	name   string
	op     ReduceOp
	root   int
	data   []byte
	vals   []int64
	decode func([][]byte) (any, error) // AllGatherDecoded
}

// CoroComm is one member of a CoroGroup. It implements Comm; its methods
// must be called from the member's own coroutine (the body RunCoroutines
// runs for it).
type CoroComm struct {
	g     *CoroGroup
	rank  int
	yield func(struct{}) bool
	seq   int

	call    coroCall
	waiting bool // call is pending
	exited  bool
	closed  bool

	gathered [][]byte
	payload  [2][]byte // AllGather's copies of data, used in turn
	decoded  any
	bcast    []byte
	reduced  []int64
	err      error
}

// coroResult is a completed (or failed) collective's outcome, shared by
// every member that waited in it.
type coroResult struct {
	err     error // the collective failed (every waiting member's error)
	out     [][]byte
	decoded any
	derr    error // AllGatherDecoded's decode error (members that decode)
	bcast   []byte
	reduced []int64
}

var _ Comm = (*CoroComm)(nil)

// Rank is this member's index.
func (c *CoroComm) Rank() int { return c.rank }

// Size is the group size.
func (c *CoroComm) Size() int { return len(c.g.members) }

// AllGather returns every member's data in rank order. The result is shared
// by every member: read-only.
func (c *CoroComm) AllGather(name string, data []byte) ([][]byte, error) {
	if err := c.enter(coroCall{kind: KindAllGather, name: name, data: c.copyPayload(data)}); err != nil {
		return nil, err
	}
	return c.gathered, nil
}

// Shared returns the group's value under key, made by create the first
// time any member asks (nccl.SharedGatherer).
func (c *CoroComm) Shared(key string, create func() any) any {
	g := c.g
	g.sharedMu.Lock()
	defer g.sharedMu.Unlock()
	v, ok := g.shared[key]
	if !ok {
		if g.shared == nil {
			g.shared = map[string]any{}
		}
		v = create()
		g.shared[key] = v
	}
	return v
}

// AllGatherDecoded is AllGather followed by decode, with decode run once
// for the whole group (the first member's function) and its result handed
// to every member: fleets of many in-process ranks decode what every rank
// gathered once instead of once per rank. The result is shared: read-only.
// A decode error is every member's error.
func (c *CoroComm) AllGatherDecoded(name string, data []byte, decode func([][]byte) (any, error)) (any, error) {
	if err := c.enter(coroCall{kind: KindAllGather, name: name, data: c.copyPayload(data), decode: decode}); err != nil {
		return nil, err
	}
	return c.decoded, nil
}

// copyPayload copies an AllGather's data into this member's buffer for the
// coming collective, on the member's own thread (RunCoroutinesParallel).
func (c *CoroComm) copyPayload(data []byte) []byte {
	b := append(c.payload[c.seq&1][:0], data...)
	c.payload[c.seq&1] = b
	c.g.outs[c.seq&1][c.rank] = b[:len(b):len(b)]
	return b
}

// Broadcast returns root's data on every member (shared, read-only).
func (c *CoroComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	if root < 0 || root >= c.Size() {
		return nil, fmt.Errorf("nccl: broadcast %q: root %d out of range [0, %d)", name, root, c.Size())
	}
	if err := c.enter(coroCall{kind: KindBroadcast, name: name, root: root, data: data}); err != nil {
		return nil, err
	}
	return c.bcast, nil
}

// AllReduceInt64 reduces vals element-wise; the result is the caller's own.
func (c *CoroComm) AllReduceInt64(name string, op ReduceOp, vals []int64) ([]int64, error) {
	if err := c.enter(coroCall{kind: KindAllReduce, name: name, op: op, vals: vals}); err != nil {
		return nil, err
	}
	return slices.Clone(c.reduced), nil
}

// Close leaves the group: members waiting for this one fail with ErrClosed.
func (c *CoroComm) Close() error {
	c.closed = true
	return nil
}

// enter registers the call and yields to the driver, which resumes this
// member once the collective completed (or failed).
func (c *CoroComm) enter(call coroCall) error {
	if c.closed {
		return &collectiveError{kind: ErrClosed, msg: fmt.Sprintf("rank %d: %s:%s called after Close", c.rank, call.kind, call.name)}
	}
	if c.yield == nil {
		return fmt.Errorf("nccl: coroutine member %d used outside RunCoroutines", c.rank)
	}
	c.call, c.waiting, c.err = call, true, nil
	if !c.yield(struct{}{}) {
		return &collectiveError{kind: ErrClosed, msg: fmt.Sprintf("rank %d: group stopped during %s:%s", c.rank, call.kind, call.name)}
	}
	// The member takes its result itself (here, not in complete: members
	// of different workers do it in parallel, each in its own caches).
	res := &c.g.res
	c.waiting, c.err = false, res.err
	if res.err == nil {
		switch call.kind {
		case KindAllGather:
			c.gathered, c.decoded = res.out, nil
			if call.decode != nil {
				c.decoded, c.err = res.decoded, res.derr
			}
		case KindBroadcast:
			c.bcast = res.bcast
		case KindAllReduce:
			c.reduced = res.reduced
		}
	}
	c.call = coroCall{}
	c.seq++
	return c.err
}

// RunCoroutines runs body(rank) for every member of g as coroutines driven
// by the calling goroutine, until every body returned, and returns their
// errors by rank. A member that returns (or closes) while others wait in a
// collective makes those fail with ErrClosed; members entering different
// collectives at the same call number all fail with ErrMismatch naming both
// sides.
func RunCoroutines(g *CoroGroup, body func(rank int, c *CoroComm) error) []error {
	errs := make([]error, len(g.members))
	all := make([]int, len(g.members))
	for r := range all {
		all[r] = r
	}
	g.rounds = make([]coroRound, 1)
	d := newCoroDriver(g, all, body, errs)
	d.round = &g.rounds[0]
	defer d.stop()
	for {
		if d.run() == 0 {
			return errs
		}
		g.complete()
	}
}

// RunCoroutinesParallel is RunCoroutines with the members dealt over
// workers driving goroutines: member r is driven by worker r mod workers,
// always the same one (its state stays in that core's caches; members
// claimed afresh by whichever worker is free each round ran slower here).
// Between two collectives the workers run their members at the same time;
// each collective completes on the last worker to reach it, exactly as
// RunCoroutines completes it (same results, errors, call count and trace),
// and no member resumes before it has. Members that share no mutable state
// except through the group therefore compute the same things whatever the
// number of workers; only the order in which members of different workers
// run between collectives changes. workers ≤ 1 (or a group of one) is
// RunCoroutines on the caller.
//
// lockThreads locks each worker to an OS thread of its own, so that a
// member's thread CPU clock counts only its worker's members (host-time
// measurements); a waiting worker then spins, then sleeps. Unlocked, a
// waiting worker yields its processor while it spins, so the garbage
// collector runs on it. Either way the caller's own locking does not
// matter.
func RunCoroutinesParallel(g *CoroGroup, workers int, lockThreads bool, body func(rank int, c *CoroComm) error) []error {
	n := len(g.members)
	workers = min(workers, n)
	if workers <= 1 {
		return RunCoroutines(g, body)
	}
	errs := make([]error, n)
	g.rounds = make([]coroRound, workers)
	b := &coroBarrier{workers: int32(workers), yield: !lockThreads, spin: coroSpinUnlocked}
	b.cond.L = &b.mu
	var wg sync.WaitGroup
	if lockThreads {
		b.spin = coroSpinLocked
	}
	for w := range workers {
		var own []int
		for r := w; r < n; r += workers {
			own = append(own, r)
		}
		wg.Go(func() {
			// The worker creates its members' coroutines: a coroutine made
			// on a locked thread must always resume on it.
			if lockThreads {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			d := newCoroDriver(g, own, body, errs)
			d.round = &g.rounds[w]
			defer d.stop()
			end := func(total int) {
				if total > 0 {
					g.complete()
				}
			}
			for b.arrive(d.run(), end) > 0 {
			}
		})
	}
	wg.Wait()
	return errs
}

// coroDriver runs a set of members as coroutines of the calling goroutine.
type coroDriver struct {
	g     *CoroGroup
	own   []int
	nexts []func() (struct{}, bool)
	stops []func()
	round *coroRound // this driver's slot of g.rounds
}

// coroRound is a driver's account of its members after a round, taken
// while they are in its own caches: the lowest rank waiting in a
// collective, the lowest one whose call decodes, and whether every
// member is waiting in a call that pairs with the first's. complete then
// checks the group against one call per driver instead of every member.
type coroRound struct {
	first, decode int // -1: none
	clean         bool
}

func newCoroDriver(g *CoroGroup, own []int, body func(rank int, c *CoroComm) error, errs []error) *coroDriver {
	d := &coroDriver{g: g, own: own}
	for _, r := range own {
		c := g.members[r]
		seq := iter.Seq[struct{}](func(yield func(struct{}) bool) {
			c.yield = yield
			errs[r] = body(r, c)
			c.exited, c.waiting = true, false
		})
		next, stop := iter.Pull(seq)
		d.nexts, d.stops = append(d.nexts, next), append(d.stops, stop)
	}
	return d
}

// run resumes every live member of the driver up to its next collective
// (or its end) and returns how many are still live.
func (d *coroDriver) run() int {
	live := 0
	rd := coroRound{first: -1, decode: -1, clean: true}
	for i, r := range d.own {
		if d.resume(i) {
			live++
		}
		c := d.g.members[r]
		switch {
		case !c.waiting:
			rd.clean = false // gone: complete reports it
		case rd.first < 0:
			rd.first = r
		case c.call.mismatch(d.g.members[rd.first].call) != nil:
			rd.clean = false
		}
		if rd.decode < 0 && c.waiting && c.call.decode != nil {
			rd.decode = r
		}
	}
	if d.round != nil {
		*d.round = rd
	}
	return live
}

// resume runs member own[i] up to its next collective and reports whether
// it is still live.
func (d *coroDriver) resume(i int) bool {
	c := d.g.members[d.own[i]]
	if c.exited {
		return false
	}
	if _, ok := d.nexts[i](); !ok {
		c.exited = true
		return false
	}
	return true
}

func (d *coroDriver) stop() {
	for _, stop := range d.stops {
		stop()
	}
}

// coroBarrier is where the workers of RunCoroutinesParallel meet at every
// collective. The last to arrive completes the collective (every other
// worker is waiting, so it alone touches the members); the others spin for
// a while, since the workers usually arrive within microseconds of each
// other, then sleep.
type coroBarrier struct {
	workers int32
	yield   bool // unlocked workers: yield the processor while spinning
	spin    int  // polls before sleeping
	arrived atomic.Int32
	live    atomic.Int32
	gen     atomic.Uint64
	total   int32 // live members at the round that just ended (written before gen moves)
	mu      sync.Mutex
	cond    sync.Cond
}

// How many times a waiting worker polls before it sleeps: about a
// millisecond either way (unlocked, it yields every 64 polls). Waking a
// sleeping worker takes tens of microseconds, longer than most rounds, so
// a worker that slept once would make the other sleep at the next round.
const (
	coroSpinLocked   = 1 << 20
	coroSpinUnlocked = 1 << 16
)

// arrive reports live members of the caller's worker and returns the live
// members of the whole group once the round ended: the last worker to
// arrive ran end(total) first, alone.
func (b *coroBarrier) arrive(live int, end func(total int)) int {
	gen := b.gen.Load()
	b.live.Add(int32(live))
	if b.arrived.Add(1) == b.workers {
		total := b.live.Load()
		b.arrived.Store(0)
		b.live.Store(0)
		end(int(total))
		b.total = total
		b.mu.Lock()
		b.gen.Add(1)
		b.cond.Broadcast()
		b.mu.Unlock()
		return int(total)
	}
	for i := range b.spin {
		if b.gen.Load() != gen {
			return int(b.total)
		}
		if b.yield && i%64 == 63 {
			runtime.Gosched()
		}
	}
	b.mu.Lock()
	for b.gen.Load() == gen {
		b.cond.Wait()
	}
	b.mu.Unlock()
	return int(b.total)
}

// complete finishes the collective every live member is waiting in: the
// result on a match, ErrClosed when some member left, ErrMismatch otherwise.
// It runs alone (every other driver waits at the barrier), so it touches as
// few members as it can: when every driver's round is clean it compares one
// call per driver; otherwise it walks every member to name the culprit.
func (g *CoroGroup) complete() {
	g.res = coroResult{}
	first, decode, clean := -1, -1, true
	for _, rd := range g.rounds {
		clean = clean && rd.clean
		if rd.first >= 0 && (first < 0 || rd.first < first) {
			first = rd.first
		}
		if rd.decode >= 0 && (decode < 0 || rd.decode < decode) {
			decode = rd.decode
		}
	}
	if first < 0 {
		clean = false
	}
	if clean {
		ref := g.members[first].call
		for _, rd := range g.rounds {
			if rd.first >= 0 && g.members[rd.first].call.mismatch(ref) != nil {
				clean = false
			}
		}
	}
	if !clean {
		var ok bool
		if first, ok = g.check(); !ok {
			return
		}
	}
	ref := g.members[first].call
	if g.tracing {
		g.trace = append(g.trace, TraceEntry{Seq: g.calls, Kind: ref.kind, Name: ref.name})
	}
	g.calls++
	switch ref.kind {
	case KindAllGather:
		// Each member put its own copy of its data in out as it entered
		// (copyPayload, on its own thread).
		out := g.outs[g.members[first].seq&1]
		g.res.out = out
		if decode >= 0 {
			g.res.decoded, g.res.derr = g.members[decode].call.decode(out)
		}
	case KindBroadcast:
		g.res.bcast = slices.Clone(g.members[ref.root].call.data)
	case KindAllReduce:
		out := slices.Clone(g.members[0].call.vals)
		for _, c := range g.members[1:] {
			for i, v := range c.call.vals {
				switch ref.op {
				case ReduceSum:
					out[i] += v
				case ReduceMin:
					out[i] = min(out[i], v)
				case ReduceMax:
					out[i] = max(out[i], v)
				}
			}
		}
		g.res.reduced = out
	}
}

// check walks every member: it fails the collective (and returns false)
// when a member left the group before entering it, or entered another
// collective than the lowest live rank, which it returns.
func (g *CoroGroup) check() (int, bool) {
	first := -1
	var gone []int
	for r, c := range g.members {
		switch {
		case c.exited || c.closed && !c.waiting:
			gone = append(gone, r)
		case first < 0:
			first = r
		}
	}
	ref := g.members[first].call
	if len(gone) > 0 {
		g.res.err = &collectiveError{kind: ErrClosed, msg: fmt.Sprintf("collective #%d %s:%s: rank %d left the group before entering it",
			g.members[first].seq, ref.kind, ref.name, gone[0])}
		return first, false
	}
	for r, c := range g.members {
		if err := c.call.mismatch(ref); err != nil {
			g.res.err = &collectiveError{kind: ErrMismatch, msg: fmt.Sprintf("collective #%d: rank %d entered %s:%s, rank %d entered %s:%s (%v)",
				c.seq, first, ref.kind, ref.name, r, c.call.kind, c.call.name, err)}
			return first, false
		}
	}
	return first, true
}

// mismatch reports how c differs from ref, or nil when they pair.
func (c coroCall) mismatch(ref coroCall) error {
	switch {
	case c.kind != ref.kind || c.name != ref.name:
		return errors.New("different collectives")
	case c.kind == KindBroadcast && c.root != ref.root:
		return fmt.Errorf("roots %d and %d", ref.root, c.root)
	case c.kind == KindAllReduce && (c.op != ref.op || len(c.vals) != len(ref.vals)):
		return fmt.Errorf("allreduce %s of %d values and %s of %d values", ref.op, len(ref.vals), c.op, len(c.vals))
	}
	return nil
}
