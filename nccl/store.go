package nccl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The bootstrap store is a small key-value service that rank 0 serves over
// TCP (on MASTER_ADDR:MASTER_PORT under torchrun-style launches, on an
// ephemeral port announced through MPI under mpirun). It carries the
// rendezvous of the TCP transport and the watchdog's side channel, where
// every rank posts the collective it last entered. It is not on the data
// path of any collective.
//
// The store listens where it is told (the launcher's address) and trusts no
// connection until it has passed the hello (handshake.go): with a job token,
// a challenge–response that proves the token and the rank; without one, a
// claim of a rank that no other connection holds. Rank 0 itself never
// connects over TCP: it talks to its store through LocalClient, and no TCP
// connection may act for rank 0. What each rank may write is the ownership
// rule of storeState; what the store holds and what one connection can make
// it allocate are bounded by StoreLimits.
//
// Wire format: every message is a frame, a little-endian u32 length and that
// many bytes. After the hello, a request frame is an op byte followed by
// length-prefixed (u32) strings; a response frame is a status byte followed
// by strings.

// StoreLimits bounds the bootstrap store. A zero field takes the default of
// DefaultStoreLimits.
type StoreLimits struct {
	// MaxKeys bounds the number of keys held.
	MaxKeys int
	// MaxKeyBytes and MaxValueBytes bound one key and one value.
	MaxKeyBytes, MaxValueBytes int
	// MaxTotalBytes bounds the sum of every key's and value's length.
	MaxTotalBytes int
	// MaxPendingConns bounds the connections that have not completed the
	// hello; further connections wait in the listener's backlog.
	MaxPendingConns int
	// HandshakeTimeout is how long a new connection has to complete the
	// hello before it is closed.
	HandshakeTimeout time.Duration
	// FrameTimeout is how long a connection has to send the rest of a
	// request once its first byte arrived, and to take its response. An
	// authenticated connection may idle between requests for as long as it
	// likes: it is one of at most WorldSize-1.
	FrameTimeout time.Duration
}

// Default store limits: a rendezvous store holds one address per service and
// one status line per rank, so these leave a wide margin while keeping what
// a misbehaving peer can pin to a few megabytes.
const (
	defaultStoreMaxKeys       = 4096
	defaultStoreMaxKeyBytes   = 256
	defaultStoreMaxValueBytes = 64 << 10
	defaultStoreMaxTotalBytes = 1 << 20
	defaultStoreMaxPending    = 16
	defaultStoreHandshake     = 10 * time.Second
	defaultStoreFrameTimeout  = 10 * time.Second
	// Per rank above the defaults, for very large worlds: keys (the status
	// key and room for a few more) and bytes.
	storeKeysPerRank  = 4
	storeBytesPerRank = 1 << 10
)

// DefaultStoreLimits returns the limits of a store serving a world of size
// ranks: 64 KiB per value, 256 bytes per key, 4096 keys and 1 MiB in all
// (more keys and bytes in proportion for worlds beyond a thousand ranks), 16
// connections in their hello at once, 10 s to complete the hello or a frame.
func DefaultStoreLimits(size int) StoreLimits {
	return StoreLimits{
		MaxKeys:          max(defaultStoreMaxKeys, storeKeysPerRank*size),
		MaxKeyBytes:      defaultStoreMaxKeyBytes,
		MaxValueBytes:    defaultStoreMaxValueBytes,
		MaxTotalBytes:    max(defaultStoreMaxTotalBytes, storeBytesPerRank*size),
		MaxPendingConns:  defaultStoreMaxPending,
		HandshakeTimeout: defaultStoreHandshake,
		FrameTimeout:     defaultStoreFrameTimeout,
	}
}

// withDefaults fills the zero fields of l from DefaultStoreLimits(size).
func (l StoreLimits) withDefaults(size int) StoreLimits {
	d := DefaultStoreLimits(size)
	pick := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	pick(&l.MaxKeys, d.MaxKeys)
	pick(&l.MaxKeyBytes, d.MaxKeyBytes)
	pick(&l.MaxValueBytes, d.MaxValueBytes)
	pick(&l.MaxTotalBytes, d.MaxTotalBytes)
	pick(&l.MaxPendingConns, d.MaxPendingConns)
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = d.HandshakeTimeout
	}
	if l.FrameTimeout <= 0 {
		l.FrameTimeout = d.FrameTimeout
	}
	return l
}

// requestFrame is the largest request frame the store reads: a Set of the
// largest key and value. Get and Wait requests are split by the client to
// fit (the limit is announced in the hello).
func (l StoreLimits) requestFrame() int { return 1 + 4 + l.MaxKeyBytes + 4 + l.MaxValueBytes }

// responseFrame is the largest response the store sends: a Get of every key
// it can hold, once.
func (l StoreLimits) responseFrame() int { return 1 + (4+1+4)*l.MaxKeys + l.MaxTotalBytes }

// DefaultStoreTimeout bounds one store request that does not wait for a key
// (and connecting to the store) when the caller gives no timeout.
const DefaultStoreTimeout = 30 * time.Second

// StoreOptions configures ListenStore.
type StoreOptions struct {
	// WorldSize is the number of ranks (at least 1); connections act for
	// ranks 1..WorldSize-1, rank 0 through LocalClient.
	WorldSize int
	// Token, when set, is required of every connection (see JobToken).
	Token JobToken
	// Limits bounds the store; zero fields take DefaultStoreLimits.
	Limits StoreLimits
	// Logger receives one line per connection that failed the hello; nil
	// logs nothing.
	Logger *zap.Logger
}

// StoreServer serves the bootstrap store. Create it with ListenStore; Close
// stops it and every connection handler (no goroutine outlives Close).
type StoreServer struct {
	ln      net.Listener
	st      *storeState
	token   JobToken
	rejects *rejectLog
	pending chan struct{} // one token per connection still in its hello

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	ranks  map[int]string // rank → remote address of the connection acting for it
	closed bool
	onGone func(rank int)
	wg     sync.WaitGroup
}

// OnRankGone has f called (on its own goroutine) when the connection of an
// admitted rank closes while the server is open: the rank's process closed
// its group or is gone (killed: the kernel closes its sockets), which rank
// 0 learns at once rather than after a collective timeout.
func (s *StoreServer) OnRankGone(f func(rank int)) {
	s.mu.Lock()
	s.onGone = f
	s.mu.Unlock()
}

// ListenStore starts a store served on addr ("host:port"; port 0 picks a
// free port, see Addr). The host must be given: an empty host would listen
// on every interface, wider than the launcher's address.
func ListenStore(addr string, o StoreOptions) (*StoreServer, error) {
	host, _, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return nil, fmt.Errorf("bootstrap store: listen address %q: %w", addr, err)
	case host == "":
		return nil, fmt.Errorf("bootstrap store: listen address %q names no host: give the address every rank reaches rank 0 at (MASTER_ADDR); an empty host would listen on every interface", addr)
	case o.WorldSize < 1:
		return nil, fmt.Errorf("bootstrap store: a world of %d ranks", o.WorldSize)
	}
	limits := o.Limits.withDefaults(o.WorldSize)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap store: listen on %s: %w", addr, err)
	}
	s := &StoreServer{ln: ln, st: newStoreState(o.WorldSize, limits), token: o.Token,
		rejects: newRejectLog(o.Logger, "bootstrap store"), pending: make(chan struct{}, limits.MaxPendingConns),
		conns: map[net.Conn]struct{}{}, ranks: map[int]string{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address the store listens on.
func (s *StoreServer) Addr() string { return s.ln.Addr().String() }

// LocalClient returns rank 0's client: an in-process connection (no TCP,
// no hello) that acts for rank 0, the owner of the rendezvous keys. timeout
// bounds each request as in DialStore. Close it before the server.
func (s *StoreServer) LocalClient(timeout time.Duration) (*StoreClient, error) {
	srv, cli := net.Pipe()
	if !s.track(srv) {
		srv.Close()
		cli.Close()
		return nil, fmt.Errorf("bootstrap store at %s: closed: %w", s.Addr(), ErrClosed)
	}
	go func() {
		defer s.untrack(srv, -1)
		s.serveRequests(srv, bufio.NewReader(srv), 0)
	}()
	return newStoreClient(s.Addr()+" (in process)", cli, timeout, s.st.limits.requestFrame()), nil
}

// Close stops the server: the listener and every connection are closed and
// Close waits for their handlers. Idempotent.
func (s *StoreServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.st.quit)
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// rejectSummary describes the connections that failed the hello ("" when
// none), for the error of a rendezvous that timed out.
func (s *StoreServer) rejectSummary() string { return s.rejects.summary() }

// track registers a connection's handler; false once the server is closed.
func (s *StoreServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

// untrack ends a connection's handler; rank is the rank it acted for (-1
// when none was admitted over TCP).
func (s *StoreServer) untrack(c net.Conn, rank int) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	var gone func(int)
	if rank > 0 {
		delete(s.ranks, rank)
		if !s.closed {
			gone = s.onGone
		}
	}
	s.mu.Unlock()
	if gone != nil {
		go gone(rank)
	}
	s.wg.Done()
}

// accept runs until the listener closes. It takes a pending slot before each
// Accept, so that at most MaxPendingConns connections are in their hello at
// once; the others wait in the kernel's backlog, costing nothing here.
func (s *StoreServer) accept() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		select {
		case s.pending <- struct{}{}:
		case <-s.st.quit:
			return
		}
		c, err := s.ln.Accept()
		if err != nil {
			<-s.pending
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or the like: wait a little instead of
			// giving up the store for good.
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, time.Second)
			case <-s.st.quit:
				return
			}
			continue
		}
		backoff = 5 * time.Millisecond
		if !s.track(c) {
			<-s.pending
			c.Close()
			return
		}
		go s.serveConn(c)
	}
}

// serveConn runs one TCP connection: the hello within HandshakeTimeout, then
// its requests.
func (s *StoreServer) serveConn(c net.Conn) {
	rank := -1
	defer func() { s.untrack(c, rank) }()
	r := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(s.st.limits.HandshakeTimeout))
	hs := helloServer{proto: storeHelloProto, token: s.token, size: s.st.size,
		limit: uint32(s.st.limits.requestFrame()), nonce: newNonce()}
	claim, err := hs.serveHello(c, r)
	if err == nil {
		if err = s.claimRank(claim.rank, c.RemoteAddr().String()); err != nil {
			writeFrame(c, rejectVerdict(err))
		} else {
			rank = claim.rank
			err = writeFrame(c, hs.accept(claim))
		}
	}
	<-s.pending // no longer in its hello
	if err != nil {
		s.rejects.add(c.RemoteAddr().String(), err)
		return
	}
	s.serveRequests(c, r, rank)
}

// claimRank admits the connection from remote as rank's: a rank has at most
// one connection.
func (s *StoreServer) claimRank(rank int, remote string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if other, ok := s.ranks[rank]; ok {
		return fmt.Errorf("rank %d is already connected to the store (from %s): two processes claim rank %d (check RANK), or another process impersonates it (set %s)",
			rank, other, rank, JobTokenEnv)
	}
	s.ranks[rank] = remote
	return nil
}

// serveRequests answers one admitted connection's requests, in order, until
// it closes. The connection acts for rank id.
func (s *StoreServer) serveRequests(c net.Conn, r *bufio.Reader, id int) {
	limits := s.st.limits
	for {
		// Idle between requests without a deadline; once a request has
		// begun, the rest of it must follow within FrameTimeout, so that a
		// half-sent frame pins nothing for long.
		c.SetDeadline(time.Time{})
		if _, err := r.Peek(1); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(limits.FrameTimeout))
		req, err := readFrame(r, limits.requestFrame())
		if err != nil {
			if errors.Is(err, errFrameTooLarge) {
				// The stream is out of step: answer why, then hang up.
				c.SetWriteDeadline(time.Now().Add(limits.FrameTimeout))
				writeFrame(c, storeStatus(storeRefused, err.Error()))
			}
			return
		}
		resp := s.st.handle(id, req)
		c.SetWriteDeadline(time.Now().Add(limits.FrameTimeout))
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
}

// appendStrings appends each string as a u32 length and its bytes.
func appendStrings(b []byte, strs ...[]byte) []byte {
	for _, s := range strs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// splitStrings parses what appendStrings wrote.
func splitStrings(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("truncated string length")
		}
		n := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("string of %d bytes in %d remaining", n, len(b))
		}
		out = append(out, b[:n:n])
		b = b[n:]
	}
	return out, nil
}

// writeFrame writes a u32 length and the frame.
func writeFrame(w io.Writer, frame []byte) error {
	bufs := net.Buffers{binary.LittleEndian.AppendUint32(nil, uint32(len(frame))), frame}
	_, err := bufs.WriteTo(w)
	return err
}

// errFrameTooLarge is wrapped by readFrame's error for a frame over its
// limit.
var errFrameTooLarge = errors.New("frame too large")

// readFrame reads one frame of at most limit bytes. It allocates the frame
// only after its length has been checked against limit.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("frame of %d bytes exceeds the %d-byte limit: %w", n, limit, errFrameTooLarge)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
