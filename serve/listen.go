package serve

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// HTTPOptions are the connection limits of the API's HTTP server.
type HTTPOptions struct {
	// MaxConnections bounds the open client connections. At the bound a
	// new connection takes the place of the longest-idle keep-alive one;
	// with none idle it is answered 503 and closed at once, so that the
	// accept loop never starves for descriptors. 0: DefaultMaxConnections,
	// lowered to leave room under the process's descriptor limit.
	MaxConnections int
	// IdleTimeout closes keep-alive connections idle this long; 0:
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HeaderTimeout bounds the time to receive a request's head; 0:
	// DefaultHeaderTimeout. (Bodies have Config.BodyTimeout.)
	HeaderTimeout time.Duration
}

// Connection defaults.
const (
	DefaultMaxConnections = 4096
	DefaultIdleTimeout    = 60 * time.Second
	DefaultHeaderTimeout  = 30 * time.Second
)

// fdReserve is what the connection bound leaves of the descriptor limit
// for everything else the process opens (model files, collectives, logs).
func fdReserve(limit uint64) uint64 { return max(64, limit/8) }

// MaxConnectionsFor is the connection bound for a descriptor limit: want
// (DefaultMaxConnections when 0), lowered to leave the reserve free.
func MaxConnectionsFor(want int, fdLimit uint64) int {
	if want <= 0 {
		want = DefaultMaxConnections
	}
	if fdLimit > 0 && fdLimit < 1<<31 {
		room := int64(fdLimit) - int64(fdReserve(fdLimit))
		want = int(min(int64(want), max(room, 1)))
	}
	return want
}

// fdLimit is the process's soft limit on open descriptors (0: unknown).
func fdLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}

// NewHTTPServer is the API's http.Server with the limits of o, and the
// listener to serve it on (ln behind the connection bound).
func (s *Server) NewHTTPServer(ln net.Listener, o HTTPOptions) (*http.Server, net.Listener) {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = DefaultHeaderTimeout
	}
	lim := &connLimiter{Listener: ln, max: MaxConnectionsFor(o.MaxConnections, fdLimit()), conns: map[*limitedConn]bool{}}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: o.HeaderTimeout, IdleTimeout: o.IdleTimeout,
		ConnState: lim.state}
	hs.RegisterOnShutdown(lim.closeUnused)
	return hs, lim
}

// MaxConnections is the bound a listener of NewHTTPServer enforces.
func MaxConnections(ln net.Listener) int {
	if l, ok := ln.(*connLimiter); ok {
		return l.max
	}
	return 0
}

// connLimiter is a listener that keeps at most max connections open.
type connLimiter struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns map[*limitedConn]bool // open connections; true: idle since idleAt

	once     sync.Once
	refusing chan struct{} // refused connections being answered
}

// limitedConn is an admitted connection; Close frees its place once.
type limitedConn struct {
	net.Conn
	lim    *connLimiter
	idleAt time.Time
	used   bool // a request started on it (under lim.mu)
	once   sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.lim.forget(c) })
	return c.Conn.Close()
}

// refusal is the whole answer to a connection over the bound.
var refusal = func() string {
	body := `{"error":{"code":null,"message":"too many open connections to this server; retry later","param":null,"type":"server_error"}}`
	return fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// Accept admits the next connection: under the bound as it is, at the
// bound in place of the longest-idle one, or else it is refused and the
// next one is awaited.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, lim: l}
		var evict *limitedConn
		l.mu.Lock()
		if len(l.conns) >= l.max {
			for o, idle := range l.conns {
				if idle && (evict == nil || o.idleAt.Before(evict.idleAt)) {
					evict = o
				}
			}
			if evict == nil {
				l.mu.Unlock()
				l.refuse(c)
				continue
			}
			delete(l.conns, evict)
		}
		l.conns[lc] = false
		l.mu.Unlock()
		if evict != nil {
			evict.Close()
		}
		return lc, nil
	}
}

// maxRefusing bounds the refused connections being answered at once; past
// it a refused connection is closed without an answer.
const maxRefusing = 64

// refuse answers a connection over the bound with 503 and closes it, off
// the accept loop. The answer follows the request's head (read for at most
// a second, 8 KiB): written before the client has sent its request, HTTP
// clients (Go's among them) take it for an unsolicited response and fail
// instead of seeing the 503.
func (l *connLimiter) refuse(c net.Conn) {
	l.once.Do(func() { l.refusing = make(chan struct{}, maxRefusing) })
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second)) //nolint:errcheck
		head := make([]byte, 0, 512)
		buf := make([]byte, 512)
		for len(head) < 8<<10 && !bytes.Contains(head, []byte("\r\n\r\n")) {
			n, err := c.Read(buf)
			head = append(head, buf[:n]...)
			if err != nil {
				break
			}
		}
		c.Write([]byte(refusal)) //nolint:errcheck // best effort: the client may be gone
	}()
}

// state follows http.Server's view of each connection.
func (l *connLimiter) state(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle, http.StateActive:
		l.mu.Lock()
		if _, open := l.conns[lc]; open {
			l.conns[lc] = st == http.StateIdle
			lc.idleAt = time.Now()
			lc.used = true
		}
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		lc.once.Do(func() { l.forget(lc) })
	}
}

// closeUnused closes the connections on which no request has started, when
// the server shuts down (http.Server.RegisterOnShutdown: the listener is
// closed by then). http.Server.Shutdown closes idle keep-alive connections
// at once but counts a connection that never sent a request as idle only
// after five seconds, so a client that dialled and then gave up (or a
// client's spare pre-dialled connection) held a draining worker's exit for
// the whole of serve's shutdown bound.
func (l *connLimiter) closeUnused() {
	l.mu.Lock()
	var unused []*limitedConn
	for c := range l.conns {
		if !c.used {
			unused = append(unused, c)
		}
	}
	l.mu.Unlock()
	for _, c := range unused {
		c.Close()
	}
}

func (l *connLimiter) forget(c *limitedConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// idle is the number of admitted connections idle between requests (tests).
func (l *connLimiter) idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, idle := range l.conns {
		if idle {
			n++
		}
	}
	return n
}

// open is the number of admitted connections (tests).
func (l *connLimiter) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
