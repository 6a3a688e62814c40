package nccl

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PeerEntry is what one rank last did in the collective layer, as posted on
// a PeerBoard: the collective it entered, the iteration it was in, and
// whether it has returned from it.
type PeerEntry struct {
	TraceEntry
	Iteration int64
	Left      bool // the rank returned from the collective
}

// String renders the entry for a timeout report.
func (e PeerEntry) String() string {
	s := fmt.Sprintf("%s (#%d, iteration %d)", quoted(e.TraceEntry), e.Seq, e.Iteration)
	if e.Left {
		return s + " and returned from it"
	}
	return s + " and is still in it"
}

// PeerBoard is the watchdog's side channel: every rank posts its latest
// collective, and a rank whose collective timed out reads everyone's.
type PeerBoard interface {
	// Post publishes this rank's latest entry. It must be cheap and must not
	// block on the network: it is called twice per collective.
	Post(e PeerEntry)
	// Snapshot returns every rank's latest posted entry (nil where a rank has
	// posted nothing), within timeout.
	Snapshot(timeout time.Duration) ([]*PeerEntry, error)
	// Close stops posting.
	Close() error
}

// StoreBoard is a PeerBoard kept in the bootstrap store: key "<prefix>/<rank>"
// holds the rank's latest entry. Post only records the entry and wakes a
// background goroutine that writes the newest entry to the store, so a
// collective never waits for a store round trip, and a burst of collectives
// costs one write (intermediate entries are skipped). The price is staleness:
// a snapshot may miss the last few milliseconds of a peer's progress, which
// is irrelevant to a peer stuck for a whole timeout.
type StoreBoard struct {
	c      *StoreClient
	rank   int
	size   int
	prefix string

	mu      sync.Mutex
	latest  PeerEntry
	pending bool  // latest not written yet
	err     error // the last write failure (the poster stops posting)

	wake chan struct{} // capacity 1: a pending entry
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

var _ PeerBoard = (*StoreBoard)(nil)

// NewStoreBoard starts the board of rank in a group of size over c (not
// owned; keep it open until Close). prefix namespaces the keys.
func NewStoreBoard(c *StoreClient, rank, size int, prefix string) *StoreBoard {
	b := &StoreBoard{c: c, rank: rank, size: size, prefix: prefix,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go b.poster()
	return b
}

// Post records e as this rank's latest entry; the write happens in the
// background.
func (b *StoreBoard) Post(e PeerEntry) {
	b.mu.Lock()
	b.latest, b.pending = e, true
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // a wake-up is already pending; it will write the newest entry
	}
}

// poster writes the newest entry whenever one is pending.
func (b *StoreBoard) poster() {
	defer close(b.done)
	key := b.prefix + "/" + strconv.Itoa(b.rank)
	for {
		select {
		case <-b.quit:
			return
		case <-b.wake:
		}
		b.mu.Lock()
		e, pending := b.latest, b.pending
		b.pending = false
		b.mu.Unlock()
		if !pending {
			continue
		}
		if err := b.c.Set(key, encodePeerEntry(e)); err != nil {
			b.mu.Lock()
			b.err = err
			b.mu.Unlock()
			return // the client is broken for good; Snapshot reports it
		}
	}
}

// Snapshot reads every rank's latest entry from the store.
func (b *StoreBoard) Snapshot(timeout time.Duration) ([]*PeerEntry, error) {
	keys := make([]string, b.size)
	for r := range keys {
		keys[r] = b.prefix + "/" + strconv.Itoa(r)
	}
	got, err := b.c.getWithin(timeout, keys)
	if err != nil {
		return nil, err
	}
	out := make([]*PeerEntry, b.size)
	for r, k := range keys {
		if v, ok := got[k]; ok {
			if e, err := decodePeerEntry(v); err == nil {
				out[r] = &e
			}
		}
	}
	return out, nil
}

// Close stops the poster (waiting at most for the write in progress, which
// the store client's timeout bounds). Idempotent.
func (b *StoreBoard) Close() error {
	b.once.Do(func() { close(b.quit) })
	<-b.done
	return nil
}

// encodePeerEntry renders e as "seq iteration left kind name" (name last: it
// may contain spaces).
func encodePeerEntry(e PeerEntry) []byte {
	return fmt.Appendf(nil, "%d %d %t %s %s", e.Seq, e.Iteration, e.Left, e.Kind, e.Name)
}

// decodePeerEntry parses what encodePeerEntry wrote.
func decodePeerEntry(b []byte) (PeerEntry, error) {
	f := strings.SplitN(string(b), " ", 5)
	if len(f) != 5 {
		return PeerEntry{}, fmt.Errorf("malformed peer entry %q", b)
	}
	var e PeerEntry
	var err1, err2, err3 error
	e.Seq, err1 = strconv.Atoi(f[0])
	e.Iteration, err2 = strconv.ParseInt(f[1], 10, 64)
	e.Left, err3 = strconv.ParseBool(f[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return PeerEntry{}, fmt.Errorf("malformed peer entry %q", b)
	}
	e.Kind, e.Name = Kind(f[3]), f[4]
	return e, nil
}

// WatchdogOptions configures a Watchdog.
type WatchdogOptions struct {
	// Timeout bounds every collective (--collective-timeout); 0 disables the
	// timer (entries are still posted on the board).
	Timeout time.Duration
	// Board is the side channel for the peers' last entries; nil reports
	// only this rank's own.
	Board PeerBoard
	// SnapshotTimeout bounds reading the board after a timeout; 0 means 5s.
	SnapshotTimeout time.Duration
}

// Watchdog wraps a Comm and runs each collective with a timeout. On expiry
// it returns an error wrapping ErrTimeout that names the collective (kind,
// name, call number), the iteration the caller last set with SetIteration,
// and what every peer last entered according to the board.
//
// A blocked collective cannot be cancelled (an MPI call never returns early):
// it keeps running on a helper goroutine, the Watchdog is unusable afterwards
// (every later call returns the timeout error), and the caller must log the
// error and exit the process with a non-zero status. Under mpirun that exit
// makes the launcher stop the other ranks. Close closes the inner Comm, which
// unblocks the helper where the transport allows it (TCP, local), not MPI.
//
// Like any Comm, a Watchdog is used by its rank's goroutine only;
// SetIteration may be called from anywhere.
type Watchdog struct {
	inner     Comm
	opts      WatchdogOptions
	seq       int
	iteration atomic.Int64
	broken    error
}

var _ Comm = (*Watchdog)(nil)

// NewWatchdog wraps inner (owned: Close closes it, not the board).
func NewWatchdog(inner Comm, opts WatchdogOptions) *Watchdog {
	if opts.SnapshotTimeout <= 0 {
		opts.SnapshotTimeout = 5 * time.Second
	}
	return &Watchdog{inner: inner, opts: opts}
}

// SetIteration tells the watchdog the executor's current iteration, for
// timeout reports and the board.
func (w *Watchdog) SetIteration(it int64) { w.iteration.Store(it) }

// Inner returns the wrapped Comm.
func (w *Watchdog) Inner() Comm { return w.inner }

// Rank is this member's index.
func (w *Watchdog) Rank() int { return w.inner.Rank() }

// Size is the group size.
func (w *Watchdog) Size() int { return w.inner.Size() }

// AllGather runs the inner AllGather under the watchdog.
func (w *Watchdog) AllGather(name string, data []byte) ([][]byte, error) {
	return guard(w, KindAllGather, name, func() ([][]byte, error) { return w.inner.AllGather(name, data) })
}

// Broadcast runs the inner Broadcast under the watchdog.
func (w *Watchdog) Broadcast(name string, root int, data []byte) ([]byte, error) {
	return guard(w, KindBroadcast, name, func() ([]byte, error) { return w.inner.Broadcast(name, root, data) })
}

// AllReduceInt64 runs the inner AllReduceInt64 under the watchdog.
func (w *Watchdog) AllReduceInt64(name string, op ReduceOp, vals []int64) ([]int64, error) {
	return guard(w, KindAllReduce, name, func() ([]int64, error) { return w.inner.AllReduceInt64(name, op, vals) })
}

// IdleWait forwards to the inner Comm when it is an IdleWaiter. It is not
// guarded: it bounds its own wait, and a member that never comes is caught
// by the collective that follows.
func (w *Watchdog) IdleWait(root int, poll, timeout time.Duration) error {
	if w.broken != nil {
		return w.broken
	}
	if in, ok := w.inner.(IdleWaiter); ok {
		return in.IdleWait(root, poll, timeout)
	}
	return nil
}

// Close closes the inner Comm.
func (w *Watchdog) Close() error { return w.inner.Close() }

// Trace returns the inner Comm's trace when it keeps one (LocalComm,
// CheckedComm), else nil.
func (w *Watchdog) Trace() []TraceEntry {
	if t, ok := w.inner.(interface{ Trace() []TraceEntry }); ok {
		return t.Trace()
	}
	return nil
}

// guard runs one collective under the watchdog.
func guard[T any](w *Watchdog, kind Kind, name string, call func() (T, error)) (T, error) {
	var zero T
	if w.broken != nil {
		return zero, w.broken
	}
	e := PeerEntry{TraceEntry: TraceEntry{Seq: w.seq, Kind: kind, Name: name}, Iteration: w.iteration.Load()}
	w.seq++
	w.post(e)
	if w.opts.Timeout <= 0 {
		v, err := call()
		e.Left = true
		w.post(e)
		return v, err
	}
	type result struct {
		v   T
		err error
	}
	// Buffered: the helper never blocks on a caller that gave up.
	done := make(chan result, 1)
	go func() {
		v, err := call()
		done <- result{v, err}
	}()
	timer := time.NewTimer(w.opts.Timeout)
	select {
	case r := <-done:
		timer.Stop()
		e.Left = true
		w.post(e)
		return r.v, r.err
	case <-timer.C:
		w.broken = w.timeoutError(e)
		return zero, w.broken
	}
}

func (w *Watchdog) post(e PeerEntry) {
	if w.opts.Board != nil {
		w.opts.Board.Post(e)
	}
}

// timeoutError builds the report of a collective that timed out.
func (w *Watchdog) timeoutError(e PeerEntry) error {
	rank := w.inner.Rank()
	var peers string
	if w.opts.Board == nil {
		peers = "no peer board to read the other ranks' last collectives from"
	} else if snap, err := w.opts.Board.Snapshot(w.opts.SnapshotTimeout); err != nil {
		peers = fmt.Sprintf("the other ranks' last collectives are unavailable (%v)", err)
	} else {
		parts := make([]string, len(snap))
		for r, p := range snap {
			switch {
			case r == rank:
				parts[r] = fmt.Sprintf("rank %d (this rank) is in it", r)
			case p == nil:
				parts[r] = fmt.Sprintf("rank %d posted no collective", r)
			default:
				parts[r] = fmt.Sprintf("rank %d last entered %s", r, p)
			}
		}
		peers = strings.Join(parts, ", ")
	}
	return &collectiveError{kind: ErrTimeout, msg: fmt.Sprintf(
		"collective #%d %s at iteration %d timed out after %v on rank %d: %s; "+
			"the call cannot be cancelled: exit the process",
		e.Seq, quoted(e.TraceEntry), e.Iteration, w.opts.Timeout, rank, peers)}
}
