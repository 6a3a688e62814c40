package nccl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"
)

// The bootstrap store is a small key-value service that rank 0 serves over
// TCP (on MASTER_ADDR:MASTER_PORT under torchrun-style launchers, on an
// ephemeral port announced through MPI under mpirun). It carries the
// rendezvous of the TCP transport and the watchdog's side channel, where
// every rank posts the collective it last entered. It is not on the data
// path of any collective.
//
// Wire format: every message is a frame, a little-endian u32 length and that
// many bytes. A request frame is an op byte followed by length-prefixed
// (u32) strings; a response frame is a status byte followed by strings.

// Store operations and response statuses.
const (
	storeOpSet  = 'S' // key, value → ok
	storeOpGet  = 'G' // keys... → ok, then (found "0"/"1", value) per key
	storeOpWait = 'W' // timeout ms (decimal), keys... → ok | timeout

	storeOK      = 'K'
	storeTimeout = 'T'
	storeBad     = 'E' // malformed request; the message follows

	// maxStoreFrame bounds what a peer can make the other side allocate.
	maxStoreFrame = 16 << 20
)

// DefaultStoreTimeout bounds one store request that does not wait for a key
// (and connecting to the store) when the caller gives no timeout.
const DefaultStoreTimeout = 30 * time.Second

// StoreServer serves the bootstrap store. Create it with ListenStore; Close
// stops it and every connection handler (no goroutine outlives Close).
type StoreServer struct {
	ln net.Listener

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every Set: wakes waiters
	conns   map[net.Conn]struct{}
	closed  bool
	quit    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// ListenStore starts a store served on addr ("host:port"; port 0 picks a
// free port, see Addr).
func ListenStore(addr string) (*StoreServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap store: listen on %s: %w", addr, err)
	}
	s := &StoreServer{ln: ln, data: map[string][]byte{}, changed: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, quit: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address the store listens on.
func (s *StoreServer) Addr() string { return s.ln.Addr().String() }

// Close stops the server: the listener and every connection are closed and
// Close waits for their handlers. Idempotent.
func (s *StoreServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.quit)
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// accept runs until the listener closes.
func (s *StoreServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// serve answers one connection's requests, in order, until it closes.
func (s *StoreServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		req, err := readFrame(r, maxStoreFrame)
		if err != nil {
			return
		}
		resp := s.handle(req)
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
}

// handle executes one request frame and returns the response frame.
func (s *StoreServer) handle(req []byte) []byte {
	if len(req) == 0 {
		return storeError("empty request")
	}
	args, err := splitStrings(req[1:])
	if err != nil {
		return storeError(err.Error())
	}
	switch req[0] {
	case storeOpSet:
		if len(args) != 2 {
			return storeError("set wants a key and a value")
		}
		s.mu.Lock()
		s.data[string(args[0])] = args[1]
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		return []byte{storeOK}
	case storeOpGet:
		resp := []byte{storeOK}
		s.mu.Lock()
		for _, k := range args {
			v, ok := s.data[string(k)]
			found := []byte("0")
			if ok {
				found = []byte("1")
			}
			resp = appendStrings(resp, found, v)
		}
		s.mu.Unlock()
		return resp
	case storeOpWait:
		if len(args) < 1 {
			return storeError("wait wants a timeout")
		}
		var ms int64
		if _, err := fmt.Sscan(string(args[0]), &ms); err != nil || ms < 0 {
			return storeError(fmt.Sprintf("bad wait timeout %q", args[0]))
		}
		if s.wait(args[1:], time.Duration(ms)*time.Millisecond) {
			return []byte{storeOK}
		}
		return []byte{storeTimeout}
	}
	return storeError(fmt.Sprintf("unknown op %q", req[0]))
}

// wait blocks until every key is set (true), the timeout passes or the
// server closes (false).
func (s *StoreServer) wait(keys [][]byte, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		missing := false
		for _, k := range keys {
			if _, ok := s.data[string(k)]; !ok {
				missing = true
				break
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if !missing {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-s.quit:
			return false
		}
	}
}

func storeError(msg string) []byte { return appendStrings([]byte{storeBad}, []byte(msg)) }

// StoreClient is a connection to the bootstrap store. Requests are
// serialised; every request has a deadline. Safe for concurrent use.
type StoreClient struct {
	addr    string
	timeout time.Duration

	mu     sync.Mutex // serialises requests
	conn   net.Conn
	r      *bufio.Reader
	broken error
}

// DialStore connects to the store at addr, retrying until timeout (rank 0
// may start its server after the other ranks start dialing). timeout also
// bounds every later request that does not wait for keys (0 means
// DefaultStoreTimeout).
func DialStore(addr string, timeout time.Duration) (*StoreClient, error) {
	if timeout <= 0 {
		timeout = DefaultStoreTimeout
	}
	conn, err := dialRetry(addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("bootstrap store at %s: %w", addr, err)
	}
	return &StoreClient{addr: addr, timeout: timeout, conn: conn, r: bufio.NewReader(conn)}, nil
}

// dialRetry dials addr until it answers or timeout passes.
func dialRetry(addr string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	backoff := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("no answer within %v: %w", timeout, ErrTimeout)
		}
		c, err := net.DialTimeout("tcp", addr, left)
		if err == nil {
			return c, nil
		}
		time.Sleep(min(backoff, left))
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// Set stores value under key, replacing any earlier value.
func (c *StoreClient) Set(key string, value []byte) error {
	_, err := c.request(c.timeout, storeOpSet, []byte(key), value)
	return err
}

// Get returns the values of the keys that are set (absent keys are missing
// from the map). It does not wait.
func (c *StoreClient) Get(keys ...string) (map[string][]byte, error) {
	return c.getWithin(c.timeout, keys)
}

// getWithin is Get with its own request deadline.
func (c *StoreClient) getWithin(timeout time.Duration, keys []string) (map[string][]byte, error) {
	args := make([][]byte, len(keys))
	for i, k := range keys {
		args[i] = []byte(k)
	}
	resp, err := c.request(timeout, storeOpGet, args...)
	if err != nil {
		return nil, err
	}
	if len(resp) != 2*len(keys) {
		return nil, fmt.Errorf("bootstrap store at %s: get answered %d strings for %d keys", c.addr, len(resp), len(keys))
	}
	out := make(map[string][]byte, len(keys))
	for i, k := range keys {
		if string(resp[2*i]) == "1" {
			out[k] = resp[2*i+1]
		}
	}
	return out, nil
}

// Wait blocks until every key is set, or fails with ErrTimeout naming the
// keys still missing after timeout.
func (c *StoreClient) Wait(keys []string, timeout time.Duration) error {
	args := [][]byte{[]byte(fmt.Sprint(timeout.Milliseconds()))}
	for _, k := range keys {
		args = append(args, []byte(k))
	}
	_, err := c.request(timeout+c.timeout, storeOpWait, args...)
	if errors.Is(err, errStoreWaitTimeout) {
		got, gerr := c.Get(keys...)
		var missing []string
		for _, k := range keys {
			if _, ok := got[k]; !ok || gerr != nil {
				missing = append(missing, k)
			}
		}
		sort.Strings(missing)
		return fmt.Errorf("bootstrap store at %s: keys %q not set within %v: %w", c.addr, missing, timeout, ErrTimeout)
	}
	return err
}

// Close closes the connection. Idempotent; safe while a request runs (it
// fails the request).
func (c *StoreClient) Close() error {
	return c.conn.Close()
}

var errStoreWaitTimeout = errors.New("store wait timed out")

// request sends one request and returns the response's strings. A failed
// exchange breaks the client (the stream may be out of step).
func (c *StoreClient) request(timeout time.Duration, op byte, args ...[]byte) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, c.broken
	}
	fail := func(err error) ([][]byte, error) {
		c.broken = fmt.Errorf("bootstrap store at %s: %w", c.addr, err)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.broken = fmt.Errorf("bootstrap store at %s: no answer within %v: %w", c.addr, timeout, ErrTimeout)
		} else if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			c.broken = fmt.Errorf("bootstrap store at %s: connection lost (%v): %w", c.addr, err, ErrClosed)
		}
		return nil, c.broken
	}
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return fail(err)
	}
	if err := writeFrame(c.conn, appendStrings([]byte{op}, args...)); err != nil {
		return fail(err)
	}
	resp, err := readFrame(c.r, maxStoreFrame)
	if err != nil {
		return fail(err)
	}
	if len(resp) == 0 {
		return fail(errors.New("empty response"))
	}
	strs, err := splitStrings(resp[1:])
	if err != nil {
		return fail(err)
	}
	switch resp[0] {
	case storeOK:
		return strs, nil
	case storeTimeout:
		return nil, errStoreWaitTimeout
	case storeBad:
		msg := "?"
		if len(strs) > 0 {
			msg = string(strs[0])
		}
		return nil, fmt.Errorf("bootstrap store at %s refused the request: %s", c.addr, msg)
	}
	return fail(fmt.Errorf("unknown response status %q", resp[0]))
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

// readFrame reads one frame of at most limit bytes.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("frame of %d bytes exceeds the %d-byte limit", n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
