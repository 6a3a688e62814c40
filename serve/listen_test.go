package serve

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// limitedServer serves s's API behind NewHTTPServer's limits.
func limitedServer(t *testing.T, s *Server, o HTTPOptions) (string, *connLimiter) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs, lim := s.NewHTTPServer(ln, o)
	go hs.Serve(lim) //nolint:errcheck
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), lim.(*connLimiter)
}

// idleConn opens a connection, makes one request on it and leaves it open
// (keep-alive, idle).
func idleConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	io.ReadAll(resp.Body) //nolint:errcheck
	resp.Body.Close()
	return c
}

// Idle keep-alive connections cannot lock real clients out: at the bound
// the longest-idle one makes room; with every connection busy a new one
// is answered 503 at once; idle connections close after the idle timeout
// (defect 6).
func TestConnectionBound(t *testing.T) {
	s, _, _ := fleetServer(t)
	addr, lim := limitedServer(t, s, HTTPOptions{MaxConnections: 4, IdleTimeout: time.Minute})
	var idle []net.Conn
	for range 4 {
		idle = append(idle, idleConn(t, addr))
	}
	// The server marks a connection idle just after writing its answer, so
	// a client can read the answer first: wait until the server sees all
	// four as idle (a new connection while one still looks busy would be
	// refused, rightly).
	require.Eventually(t, func() bool { return lim.open() == 4 && lim.idle() == 4 }, 5*time.Second, time.Millisecond)
	// A real client among idle ones is served.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for range 3 {
		resp, err := client.Get("http://" + addr + "/health")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	require.LessOrEqual(t, lim.open(), 4)
	for _, c := range idle {
		c.Close()
	}
	require.Eventually(t, func() bool { return lim.open() == 0 }, 5*time.Second, time.Millisecond)

	// Four connections busy (bodies on their way): the fifth is refused.
	var busy []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
		require.NoError(t, err)
		busy = append(busy, c)
	}
	require.Eventually(t, func() bool { return lim.open() == 4 && lim.idle() == 0 }, 5*time.Second, time.Millisecond)
	start := time.Now()
	resp, err := client.Get("http://" + addr + "/health")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, string(b), "too many open connections")
	require.Less(t, time.Since(start), 2*time.Second, "refused at once")
	for _, c := range busy {
		c.Close()
	}
	require.Eventually(t, func() bool { return lim.open() == 0 }, 5*time.Second, time.Millisecond)
}

func TestIdleTimeout(t *testing.T) {
	s, _, _ := fleetServer(t)
	addr, lim := limitedServer(t, s, HTTPOptions{IdleTimeout: 200 * time.Millisecond})
	c := idleConn(t, addr)
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closes an idle connection")
	require.Eventually(t, func() bool { return lim.open() == 0 }, 5*time.Second, time.Millisecond)
}

// The default bound leaves room under the descriptor limit.
func TestMaxConnectionsFor(t *testing.T) {
	require.Equal(t, 192, MaxConnectionsFor(0, 256))
	require.Equal(t, DefaultMaxConnections, MaxConnectionsFor(0, 1<<20))
	require.Equal(t, 10, MaxConnectionsFor(10, 256))
	require.Equal(t, 1, MaxConnectionsFor(0, 8))
	require.Equal(t, DefaultMaxConnections, MaxConnectionsFor(0, 0))
	require.True(t, strings.HasPrefix(refusal, "HTTP/1.1 503 "))
}

// Shutdown does not wait for a connection on which no request was ever
// sent (http.Server counts such a connection idle only after five
// seconds): it is closed at once, as idle keep-alive ones are, so a
// draining worker exits as soon as its requests are answered.
func TestShutdownClosesUnusedConnections(t *testing.T) {
	s, _, _ := fleetServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs, lim := s.NewHTTPServer(ln, HTTPOptions{})
	go hs.Serve(lim) //nolint:errcheck
	t.Cleanup(func() { hs.Close() })
	addr := ln.Addr().String()
	kept := idleConn(t, addr)
	unused, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { unused.Close() })
	require.Eventually(t, func() bool { return lim.(*connLimiter).open() == 2 }, 5*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	require.NoError(t, hs.Shutdown(ctx), "shutdown must not wait for the unused connection")
	for _, c := range []net.Conn{kept, unused} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "the server closed it")
	}
}
