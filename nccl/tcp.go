package nccl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// TCPOptions configures a TCP transport (torchrun-style launches without MPI).
type TCPOptions struct {
	// Rank and Size place this process in the group.
	Rank, Size int
	// Store is the bootstrap store used for the rendezvous (rank 0 publishes
	// its data address there). Not owned by the transport.
	Store *StoreClient
	// Host is the address rank 0 listens on and publishes, reachable by every
	// rank (MASTER_ADDR). Ignored on other ranks. "" means 127.0.0.1.
	Host string
	// Key namespaces the rendezvous key in the store; "" means "lockstep/tcp".
	Key string
	// ConnectTimeout bounds the whole rendezvous; 0 means 60s.
	ConnectTimeout time.Duration
	// OpTimeout is a backstop I/O deadline of one collective; 0 means none
	// (the watchdog bounds collectives; it closes the transport on expiry).
	OpTimeout time.Duration
	// Token, when set, authenticates every connection to rank 0 both ways
	// (see JobToken); it must be the same on every rank, or unset on all.
	Token JobToken
	// HelloTimeout bounds one connection's hello at rank 0; 0 means 10s.
	HelloTimeout time.Duration
	// Logger receives, on rank 0, one line per connection closed for failing
	// the hello; nil logs nothing.
	Logger *zap.Logger
}

// maxTransportFrame bounds one frame of the TCP transport.
const maxTransportFrame = 1 << 30

// TCPTransport is a Transport over TCP, a star through rank 0: every rank
// sends its payload to rank 0, which answers each with the gathered vector.
// Collectives are O(size) messages through rank 0, which is fine for the
// per-iteration control traffic this carries (counts, digests, events).
type TCPTransport struct {
	rank, size int
	opTimeout  time.Duration

	ln    net.Listener // rank 0
	peers []*tcpPeer   // rank 0: by rank (peers[0] nil); others: peers[0] = rank 0

	closeOnce sync.Once
	closeErr  error
}

// tcpPeer is one connection with a buffered reader.
type tcpPeer struct {
	conn net.Conn
	r    *bufio.Reader
}

var _ Transport = (*TCPTransport)(nil)

// NewTCPTransport connects the group: rank 0 listens on Host (and nowhere
// wider), publishes the address in the store and admits Size-1 connections
// that pass the hello (handshake.go); the other ranks wait for the address,
// connect and prove their rank. It returns once every rank is connected
// (rank 0 acknowledges each connection only then), or fails after
// ConnectTimeout naming the ranks that were missing and the connections rank
// 0 turned away. A connection that fails the hello (garbage, a wrong or
// missing token, a rank out of range or already taken, a connect-and-close)
// is closed and logged, and rank 0 keeps waiting for the real peers.
func NewTCPTransport(o TCPOptions) (*TCPTransport, error) {
	if o.Size <= 0 || o.Rank < 0 || o.Rank >= o.Size {
		return nil, fmt.Errorf("tcp transport: rank %d of size %d is not a valid placement", o.Rank, o.Size)
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 60 * time.Second
	}
	if o.Key == "" {
		o.Key = "lockstep/tcp"
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = defaultTCPHelloTimeout
	}
	t := &TCPTransport{rank: o.Rank, size: o.Size, opTimeout: o.OpTimeout}
	if o.Size == 1 {
		return t, nil
	}
	if o.Store == nil {
		return nil, errors.New("tcp transport: a bootstrap store is required for more than one rank")
	}
	var err error
	if o.Rank == 0 {
		err = t.acceptPeers(o)
	} else {
		err = t.connectRoot(o)
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Rank is this member's index.
func (t *TCPTransport) Rank() int { return t.rank }

// Size is the group size.
func (t *TCPTransport) Size() int { return t.size }

// AllGatherBytes sends payload to rank 0 and returns the gathered vector.
func (t *TCPTransport) AllGatherBytes(payload []byte) ([][]byte, error) {
	if t.size == 1 {
		return [][]byte{append([]byte(nil), payload...)}, nil
	}
	if t.opTimeout > 0 {
		deadline := time.Now().Add(t.opTimeout)
		for _, p := range t.peers {
			if p != nil {
				p.conn.SetDeadline(deadline)
			}
		}
	}
	if t.rank == 0 {
		return t.gatherAtRoot(payload)
	}
	p := t.peers[0]
	if err := writeFrame(p.conn, payload); err != nil {
		return nil, t.ioError(0, err)
	}
	frame, err := readFrame(p.r, maxTransportFrame)
	if err != nil {
		return nil, t.ioError(0, err)
	}
	out, err := splitStrings(frame)
	if err != nil || len(out) != t.size {
		t.Close()
		return nil, fmt.Errorf("tcp transport: rank 0 sent a malformed gathered vector (%d parts, %v)", len(out), err)
	}
	return out, nil
}

// gatherAtRoot reads every peer's payload in rank order and sends the
// vector back to each.
func (t *TCPTransport) gatherAtRoot(payload []byte) ([][]byte, error) {
	out := make([][]byte, t.size)
	out[0] = append([]byte(nil), payload...)
	for r := 1; r < t.size; r++ {
		b, err := readFrame(t.peers[r].r, maxTransportFrame)
		if err != nil {
			return nil, t.ioError(r, err)
		}
		out[r] = b
	}
	vec := appendStrings(nil, out...)
	if len(vec) > maxTransportFrame {
		return nil, fmt.Errorf("tcp transport: gathered vector of %d bytes exceeds the %d-byte frame limit", len(vec), maxTransportFrame)
	}
	for r := 1; r < t.size; r++ {
		if err := writeFrame(t.peers[r].conn, vec); err != nil {
			return nil, t.ioError(r, err)
		}
	}
	return out, nil
}

// ioError names the peer a failed read or write was talking to and wraps
// ErrTimeout (deadline) or ErrClosed (anything else: the peer is gone). It
// closes the transport: the group is no longer paired, and closing makes the
// failure reach every other rank at once instead of leaving them blocked on
// rank 0 (or rank 0 blocked on them).
func (t *TCPTransport) ioError(peer int, err error) error {
	t.Close()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("tcp transport: rank %d: no progress with rank %d within %v: %w", t.rank, peer, t.opTimeout, ErrTimeout)
	}
	what := "connection lost"
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		what = "peer closed the connection"
	}
	return fmt.Errorf("tcp transport: rank %d: %s with rank %d (%v): %w", t.rank, what, peer, err, ErrClosed)
}

// Close closes every connection; a collective blocked in another goroutine
// fails with ErrClosed. Idempotent.
func (t *TCPTransport) Close() error {
	t.closeOnce.Do(func() {
		if t.ln != nil {
			t.closeErr = t.ln.Close()
		}
		for _, p := range t.peers {
			if p != nil {
				p.conn.Close()
			}
		}
	})
	return t.closeErr
}
