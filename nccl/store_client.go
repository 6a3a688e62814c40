package nccl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"
)

// ErrStoreRefused is wrapped by the error of a store request that the
// store's ownership rule or limits refused (the message says which).
var ErrStoreRefused = errors.New("refused by the bootstrap store")

// maxStoreResponse bounds what a store (or a process posing as one, before
// it has proven the token) can make a client allocate for one response.
const maxStoreResponse = 16 << 20

// minStoreRequestLimit is the smallest request limit a store may announce:
// below it not even a Set of a short key fits.
const minStoreRequestLimit = 64

// StoreClientOptions configures DialStore.
type StoreClientOptions struct {
	// Rank is the rank this client acts for, in [1, WorldSize) (rank 0 uses
	// StoreServer.LocalClient); WorldSize must match the store's.
	Rank, WorldSize int
	// Token is the job token; it must be set exactly when the store's is
	// (and be the same).
	Token JobToken
	// Timeout bounds connecting (dialing is retried until then, as rank 0
	// may start its server after the other ranks) and every later request
	// that does not wait for keys; 0 means DefaultStoreTimeout.
	Timeout time.Duration
}

// StoreClient is a connection to the bootstrap store, acting for one rank.
// Requests are serialised; every request has a deadline. Safe for
// concurrent use.
type StoreClient struct {
	addr       string
	timeout    time.Duration
	maxRequest int // the store's request frame limit

	mu     sync.Mutex // serialises requests
	conn   net.Conn
	r      *bufio.Reader
	broken error
}

func newStoreClient(addr string, conn net.Conn, timeout time.Duration, maxRequest int) *StoreClient {
	if timeout <= 0 {
		timeout = DefaultStoreTimeout
	}
	return &StoreClient{addr: addr, timeout: timeout, maxRequest: maxRequest, conn: conn, r: bufio.NewReader(conn)}
}

// DialStore connects to the store at addr and runs the hello: the client
// proves the job token and its rank, and checks rank 0's proof in return. A
// missing, unexpected or different token fails at once with an error
// wrapping ErrAuth that says which side lacks what.
func DialStore(addr string, o StoreClientOptions) (*StoreClient, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultStoreTimeout
	}
	conn, err := dialRetry(addr, o.Timeout)
	if err != nil {
		return nil, fmt.Errorf("bootstrap store at %s: %w", addr, err)
	}
	c := newStoreClient(addr, conn, o.Timeout, 0)
	conn.SetDeadline(time.Now().Add(o.Timeout))
	hc := helloClient{proto: storeHelloProto, token: o.Token, rank: o.Rank, size: o.WorldSize}
	ch, err := hc.runHello(conn, c.r)
	if err == nil && ch.limit < minStoreRequestLimit {
		err = fmt.Errorf("the store announces a request limit of %d bytes", ch.limit)
	}
	if err != nil {
		conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: %w", err, ErrTimeout)
		}
		return nil, fmt.Errorf("bootstrap store at %s: %w", addr, err)
	}
	conn.SetDeadline(time.Time{})
	c.maxRequest = int(min(ch.limit, maxStoreResponse))
	return c, nil
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

// Set stores value under key. The ownership rule applies (see storeState):
// a status key ("<prefix>/<rank>") is rewritable by its rank, any other key
// is written once, by rank 0. A refusal wraps ErrStoreRefused.
func (c *StoreClient) Set(key string, value []byte) error {
	if n := 1 + 4 + len(key) + 4 + len(value); n > c.maxRequest {
		return &storeRefusal{fmt.Sprintf("bootstrap store at %s: setting key %q: a request of %d bytes exceeds the store's %d-byte limit",
			c.addr, key, n, c.maxRequest)}
	}
	_, err := c.request(c.timeout, storeOpSet, []byte(key), value)
	return err
}

// Get returns the values of the keys that are set (absent keys are missing
// from the map). It does not wait.
func (c *StoreClient) Get(keys ...string) (map[string][]byte, error) {
	return c.getWithin(c.timeout, keys)
}

// getWithin is Get with its own deadline per request (the keys are asked in
// as many requests as the store's request limit needs).
func (c *StoreClient) getWithin(timeout time.Duration, keys []string) (map[string][]byte, error) {
	batches, err := c.batches(keys, 0)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(keys))
	for _, batch := range batches {
		resp, err := c.request(timeout, storeOpGet, batch...)
		if err != nil {
			return nil, err
		}
		if len(resp) != 2*len(batch) {
			return nil, fmt.Errorf("bootstrap store at %s: get answered %d strings for %d keys", c.addr, len(resp), len(batch))
		}
		for i, k := range batch {
			if string(resp[2*i]) == "1" {
				out[string(k)] = resp[2*i+1]
			}
		}
	}
	return out, nil
}

// batches splits keys into the argument lists of requests that fit the
// store's request limit, leaving room for reserved bytes of other arguments.
func (c *StoreClient) batches(keys []string, reserved int) ([][][]byte, error) {
	room := c.maxRequest - 1 - reserved
	var out [][][]byte
	var cur [][]byte
	used := 0
	for _, k := range keys {
		n := 4 + len(k)
		if n > room {
			return nil, &storeRefusal{fmt.Sprintf("bootstrap store at %s: key of %d bytes exceeds the store's request limit of %d bytes",
				c.addr, len(k), c.maxRequest)}
		}
		if used+n > room {
			out, cur, used = append(out, cur), nil, 0
		}
		cur = append(cur, []byte(k))
		used += n
	}
	return append(out, cur), nil
}

// Wait blocks until every key is set, or fails with ErrTimeout naming the
// keys still missing after timeout.
func (c *StoreClient) Wait(keys []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// The timeout argument is at most len("86400000") digits.
	batches, err := c.batches(keys, 4+len(strconv.FormatInt(maxStoreWait.Milliseconds(), 10)))
	if err != nil {
		return err
	}
	for _, batch := range batches {
		left := max(time.Until(deadline), 0)
		args := append([][]byte{[]byte(strconv.FormatInt(left.Milliseconds(), 10))}, batch...)
		_, err := c.request(left+c.timeout, storeOpWait, args...)
		if errors.Is(err, errStoreWaitTimeout) {
			return c.waitTimeout(keys, timeout)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// waitTimeout is the error of a Wait that timed out: it names the keys
// still missing.
func (c *StoreClient) waitTimeout(keys []string, timeout time.Duration) error {
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

// Close closes the connection. Idempotent; safe while a request runs (it
// fails the request).
func (c *StoreClient) Close() error {
	return c.conn.Close()
}

var errStoreWaitTimeout = errors.New("store wait timed out")

// storeRefusal is a request the store refused (wraps ErrStoreRefused).
type storeRefusal struct{ msg string }

func (e *storeRefusal) Error() string { return e.msg }
func (e *storeRefusal) Unwrap() error { return ErrStoreRefused }

// request sends one request and returns the response's strings. A failed
// exchange breaks the client (the stream may be out of step); a refused or
// malformed request does not.
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
		} else if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) {
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
	resp, err := readFrame(c.r, maxStoreResponse)
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
	msg := "?"
	if len(strs) > 0 {
		msg = printable(strs[0])
	}
	switch resp[0] {
	case storeOK:
		return strs, nil
	case storeTimeout:
		return nil, errStoreWaitTimeout
	case storeRefused:
		return nil, &storeRefusal{fmt.Sprintf("bootstrap store at %s refused the request: %s", c.addr, msg)}
	case storeBad:
		return nil, fmt.Errorf("bootstrap store at %s: malformed request: %s", c.addr, msg)
	}
	return fail(fmt.Errorf("unknown response status %q", resp[0]))
}
