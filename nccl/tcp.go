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
}

// maxTransportFrame bounds one frame of the TCP transport.
const maxTransportFrame = 1 << 30

// tcpHello is the first frame a rank sends to rank 0: magic, rank, size.
const tcpHelloMagic = "LSTCP1"

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

// NewTCPTransport connects the group: rank 0 listens on Host, publishes the
// address in the store and accepts Size-1 connections; the other ranks wait
// for the address, connect and announce their rank. It returns once every
// rank is connected (rank 0 acknowledges each connection only then), or fails
// after ConnectTimeout naming what was missing.
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

// acceptPeers is rank 0's side of the rendezvous.
func (t *TCPTransport) acceptPeers(o TCPOptions) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, "0"))
	if err != nil {
		return fmt.Errorf("tcp transport: rank 0 listen on %s: %w", o.Host, err)
	}
	t.ln = ln
	if err := o.Store.Set(o.Key+"/addr", []byte(ln.Addr().String())); err != nil {
		return fmt.Errorf("tcp transport: publish address: %w", err)
	}
	deadline := time.Now().Add(o.ConnectTimeout)
	if err := ln.(*net.TCPListener).SetDeadline(deadline); err != nil {
		return err
	}
	t.peers = make([]*tcpPeer, o.Size)
	for n := 1; n < o.Size; n++ {
		conn, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("tcp transport: rank 0 waited %v for the other ranks, missing %v: %w",
				o.ConnectTimeout, t.missing(), ErrTimeout)
		}
		p := &tcpPeer{conn: conn, r: bufio.NewReader(conn)}
		conn.SetDeadline(deadline)
		hello, err := readFrame(p.r, 64)
		r, size, herr := parseHello(hello)
		switch {
		case err != nil:
			err = fmt.Errorf("tcp transport: reading a peer's hello: %w", err)
		case herr != nil:
			err = fmt.Errorf("tcp transport: a peer from %s: %w", conn.RemoteAddr(), herr)
		case size != o.Size:
			err = fmt.Errorf("tcp transport: rank %d believes the world has %d ranks, rank 0 believes %d", r, size, o.Size)
		case r <= 0 || r >= o.Size:
			err = fmt.Errorf("tcp transport: a peer announced rank %d, outside [1, %d)", r, o.Size)
		case t.peers[r] != nil:
			err = fmt.Errorf("tcp transport: two processes announced rank %d (check RANK)", r)
		}
		if err != nil {
			conn.Close()
			return err
		}
		t.peers[r] = p
	}
	// Everyone is here: acknowledge, so that no rank starts before the group
	// is complete, and clear the rendezvous deadlines.
	for _, p := range t.peers[1:] {
		if err := writeFrame(p.conn, []byte("ok")); err != nil {
			return fmt.Errorf("tcp transport: acknowledging a peer: %w", err)
		}
		p.conn.SetDeadline(time.Time{})
	}
	return nil
}

// missing lists the ranks that have not connected yet (rank 0, during accept).
func (t *TCPTransport) missing() []int {
	var out []int
	for r := 1; r < t.size; r++ {
		if t.peers[r] == nil {
			out = append(out, r)
		}
	}
	return out
}

// connectRoot is a non-zero rank's side of the rendezvous.
func (t *TCPTransport) connectRoot(o TCPOptions) error {
	deadline := time.Now().Add(o.ConnectTimeout)
	key := o.Key + "/addr"
	if err := o.Store.Wait([]string{key}, o.ConnectTimeout); err != nil {
		return fmt.Errorf("tcp transport: rank %d waiting for rank 0's address: %w", o.Rank, err)
	}
	got, err := o.Store.Get(key)
	if err != nil {
		return err
	}
	conn, err := dialRetry(string(got[key]), time.Until(deadline))
	if err != nil {
		return fmt.Errorf("tcp transport: rank %d connecting to rank 0 at %s: %w", o.Rank, got[key], err)
	}
	p := &tcpPeer{conn: conn, r: bufio.NewReader(conn)}
	t.peers = []*tcpPeer{p}
	conn.SetDeadline(deadline)
	hello := append([]byte(tcpHelloMagic), binary.LittleEndian.AppendUint32(
		binary.LittleEndian.AppendUint32(nil, uint32(o.Rank)), uint32(o.Size))...)
	if err := writeFrame(conn, hello); err != nil {
		return fmt.Errorf("tcp transport: rank %d hello: %w", o.Rank, err)
	}
	ack, err := readFrame(p.r, 64)
	if err != nil || string(ack) != "ok" {
		return fmt.Errorf("tcp transport: rank %d: rank 0 did not complete the group within %v (%v): %w",
			o.Rank, o.ConnectTimeout, err, ErrTimeout)
	}
	conn.SetDeadline(time.Time{})
	return nil
}

// parseHello decodes a hello frame.
func parseHello(b []byte) (rank, size int, err error) {
	if len(b) != len(tcpHelloMagic)+8 || string(b[:len(tcpHelloMagic)]) != tcpHelloMagic {
		return 0, 0, errors.New("not a lockstep TCP transport hello")
	}
	b = b[len(tcpHelloMagic):]
	return int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:])), nil
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
