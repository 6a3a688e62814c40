package nccl

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Rendezvous bounds at rank 0.
const (
	// defaultTCPHelloTimeout is how long one connection has to complete its
	// hello (TCPOptions.HelloTimeout).
	defaultTCPHelloTimeout = 10 * time.Second
	// tcpMaxPendingHellos bounds the connections in their hello at once;
	// further connections wait in the listener's backlog.
	tcpMaxPendingHellos = 16
	// tcpRejectWrite bounds writing a refusal to a peer that may not read.
	tcpRejectWrite = time.Second
)

// helloResult is one connection's hello, as its handler hands it to the
// rendezvous loop.
type helloResult struct {
	peer  *tcpPeer
	hs    *helloServer
	claim helloClaim
	err   error
}

// acceptPeers is rank 0's side of the rendezvous. Each connection runs its
// hello on its own goroutine (at most tcpMaxPendingHellos at once, each for
// at most HelloTimeout), so that a peer that connects and says nothing delays
// no one; the loop here admits the claims that pass, one per rank, and turns
// the others away, until every rank is present or ConnectTimeout passes.
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
	rejects := newRejectLog(o.Logger, "tcp transport")
	h := &helloHandlers{results: make(chan helloResult), done: make(chan struct{}),
		pending: make(chan struct{}, tcpMaxPendingHellos), inflight: map[net.Conn]struct{}{}}
	h.wg.Add(1)
	go h.acceptLoop(ln, func(conn net.Conn) helloResult { return serveTCPHello(conn, o, deadline) })

	accepted := make([]helloResult, o.Size)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for missing := o.Size - 1; missing > 0 && err == nil; {
		select {
		case res := <-h.results:
			if res.err == nil && t.peers[res.claim.rank] != nil {
				res.err = fmt.Errorf("rank %d is already connected (from %s): two processes claim rank %d (check RANK), or another process impersonates it (set %s)",
					res.claim.rank, t.peers[res.claim.rank].conn.RemoteAddr(), res.claim.rank, JobTokenEnv)
				res.peer.conn.SetWriteDeadline(time.Now().Add(tcpRejectWrite))
				writeFrame(res.peer.conn, rejectVerdict(res.err))
			}
			if res.err != nil {
				rejects.add(res.peer.conn.RemoteAddr().String(), res.err)
				res.peer.conn.Close()
				continue
			}
			o.Logger.Debug("tcp transport: a rank joined the rendezvous", zap.Int("peer_rank", res.claim.rank),
				zap.String("remote", res.peer.conn.RemoteAddr().String()))
			res.peer.conn.SetDeadline(deadline)
			t.peers[res.claim.rank] = res.peer
			accepted[res.claim.rank] = res
			missing--
		case <-timer.C:
			rejected := rejects.summary()
			if rejected != "" {
				rejected = " (" + rejected + ")"
			}
			err = fmt.Errorf("tcp transport: rank 0 waited %v for the other ranks, missing %v%s: %w",
				o.ConnectTimeout, t.missing(), rejected, ErrTimeout)
		}
	}
	// The group is complete (or given up): stop listening, and stop every
	// hello still running.
	t.ln = nil
	ln.Close()
	h.stop()
	if err != nil {
		// Tell the ranks already admitted why they will not be acknowledged,
		// rather than leave them to their own timeout.
		for _, res := range accepted {
			if res.peer != nil {
				res.peer.conn.SetWriteDeadline(time.Now().Add(tcpRejectWrite))
				writeFrame(res.peer.conn, rejectVerdict(fmt.Errorf("rank 0 gave up: %w", err)))
			}
		}
		return err
	}
	// Everyone is here: acknowledge, with rank 0's proof, so that no rank
	// starts before the group is complete, and clear the rendezvous
	// deadlines.
	for r := 1; r < o.Size; r++ {
		res := accepted[r]
		if err := writeFrame(res.peer.conn, res.hs.accept(res.claim)); err != nil {
			return fmt.Errorf("tcp transport: acknowledging rank %d: %w", r, err)
		}
		res.peer.conn.SetDeadline(time.Time{})
	}
	return nil
}

// serveTCPHello runs the hello of one connection to rank 0.
func serveTCPHello(conn net.Conn, o TCPOptions, deadline time.Time) helloResult {
	helloDeadline := time.Now().Add(o.HelloTimeout)
	if deadline.Before(helloDeadline) {
		helloDeadline = deadline
	}
	conn.SetDeadline(helloDeadline)
	p := &tcpPeer{conn: conn, r: bufio.NewReader(conn)}
	hs := &helloServer{proto: tcpHelloProto, token: o.Token, size: o.Size, nonce: newNonce()}
	claim, err := hs.serveHello(conn, p.r)
	return helloResult{peer: p, hs: hs, claim: claim, err: err}
}

// helloHandlers runs the acceptor and the per-connection hello goroutines of
// one rendezvous, and stops them all.
type helloHandlers struct {
	results chan helloResult
	done    chan struct{} // closed by stop
	pending chan struct{} // one token per connection in its hello
	wg      sync.WaitGroup

	mu       sync.Mutex
	inflight map[net.Conn]struct{} // connections whose hello is running
	stopped  bool
}

// acceptLoop accepts connections until the listener closes or its deadline
// passes, running hello on each.
func (h *helloHandlers) acceptLoop(ln net.Listener, hello func(net.Conn) helloResult) {
	defer h.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		select {
		case h.pending <- struct{}{}:
		case <-h.done:
			return
		}
		conn, err := ln.Accept()
		if err != nil {
			<-h.pending
			var ne net.Error
			if errors.Is(err, net.ErrClosed) || (errors.As(err, &ne) && ne.Timeout()) {
				return
			}
			// Out of descriptors or the like: retry a little later.
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, time.Second)
			case <-h.done:
				return
			}
			continue
		}
		backoff = 5 * time.Millisecond
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			<-h.pending
			conn.Close()
			return
		}
		h.inflight[conn] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go func() {
			defer h.wg.Done()
			res := hello(conn)
			<-h.pending
			h.mu.Lock()
			delete(h.inflight, conn)
			h.mu.Unlock()
			select {
			case h.results <- res:
			case <-h.done:
				conn.Close()
			}
		}()
	}
}

// stop ends the acceptor (the caller has closed the listener) and every
// hello still running, and waits for them.
func (h *helloHandlers) stop() {
	h.mu.Lock()
	h.stopped = true
	close(h.done)
	for c := range h.inflight {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
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
	hc := helloClient{proto: tcpHelloProto, token: o.Token, rank: o.Rank, size: o.Size}
	if _, err := hc.runHello(conn, p.r); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("tcp transport: rank %d: rank 0 did not complete the group within %v (%v): %w",
				o.Rank, o.ConnectTimeout, err, ErrTimeout)
		}
		return fmt.Errorf("tcp transport: rank %d connecting to rank 0 at %s: %w", o.Rank, got[key], err)
	}
	conn.SetDeadline(time.Time{})
	return nil
}
