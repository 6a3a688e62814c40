package kvevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The publisher's TCP sockets are reachable by anyone who can reach the port
// (vLLM's default endpoint binds every interface). go-zeromq/zmq4 v0.17.0
// allocates a frame's body from the size its peer announces, before reading
// it: a peer that announces a frame of 2^62 bytes panics the process
// ("makeslice: len out of range", in a goroutine of the library, where no
// recover can reach), and one of a few GiB takes that much memory. So the
// sockets run on a TCP transport of our own whose connections follow the
// incoming ZMTP stream and close a connection whose frame exceeds
// maxPeerFrame before the library sees its header. What a subscriber or a
// replay client legitimately sends (the greeting, READY with its metadata,
// subscriptions, an 8-byte replay request) is far below it.

// guardScheme is the transport's name in zmq4's registry: a "tcp://"
// endpoint is opened as "lockstep-tcp://" (guarded), the same address.
const guardScheme = "lockstep-tcp"

// maxPeerFrame bounds one incoming ZMTP frame.
const maxPeerFrame = 1 << 20

// errPeerFrame closes a connection whose peer announced a frame over
// maxPeerFrame.
var errPeerFrame = errors.New("kv events: a peer announced a ZMTP frame over 1 MiB; connection closed")

var registerGuard = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(guardScheme, guardTransport{transport.New("tcp")})
})

// guarded is ep with the guarded transport when it is a TCP endpoint.
func guarded(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return ep, nil
	}
	if err := registerGuard(); err != nil {
		return "", err
	}
	return guardScheme + "://" + rest, nil
}

// guardTransport is TCP whose connections are zmtpGuards.
type guardTransport struct{ tcp transport.Transport }

func (g guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &zmtpGuard{Conn: c, greeting: zmtpGreeting}, nil
}

func (g guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := g.tcp.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return guardListener{l}, nil
}

func (g guardTransport) Addr(ep string) (string, error) { return g.tcp.Addr(ep) }

type guardListener struct{ net.Listener }

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &zmtpGuard{Conn: c, greeting: zmtpGreeting}, nil
}

// zmtpGreeting is the length of a ZMTP 3 greeting (signature, version,
// mechanism, as-server, filler).
const zmtpGreeting = 64

// zmtpGuard follows the frames a peer sends (ZMTP 3: the greeting, then
// frames of a flags byte, a 1- or 8-byte size, the body) and fails the read
// that would hand the library a header announcing more than maxPeerFrame.
type zmtpGuard struct {
	net.Conn
	greeting int    // greeting bytes still to come
	sizeLeft int    // size bytes of the current header still to come (0: a flags byte is next)
	size     uint64 // the size read so far
	body     uint64 // body bytes of the current frame still to come
	failed   bool
}

func (c *zmtpGuard) Read(p []byte) (int, error) {
	if c.failed {
		return 0, errPeerFrame
	}
	n, err := c.Conn.Read(p)
	if !c.scan(p[:n]) {
		c.failed = true
		c.Conn.Close()
		return 0, errPeerFrame
	}
	return n, err
}

// scan advances the frame state over b; false when a frame is too large.
func (c *zmtpGuard) scan(b []byte) bool {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
		case c.sizeLeft > 0:
			c.size = c.size<<8 | uint64(b[0])
			c.sizeLeft--
			b = b[1:]
			if c.sizeLeft == 0 {
				if c.size > maxPeerFrame {
					return false
				}
				c.body = c.size
			}
		default: // a flags byte: bit 1 is LONG (an 8-byte size)
			c.sizeLeft, c.size = 1, 0
			if b[0]&0x02 != 0 {
				c.sizeLeft = 8
			}
			b = b[1:]
		}
	}
	return true
}

// zmqLog is the sockets' logger: go-zeromq logs every connection it could
// not open (a port scanner, a client speaking another protocol) on the
// standard logger; here at most one line in ten seconds reaches stderr,
// with the count of those left out.
var zmqLog = log.New(&sparseWriter{w: os.Stderr, every: 10 * time.Second}, "kv events: zmq4: ", 0)

// sparseWriter writes a line when the last one it wrote is older than every.
type sparseWriter struct {
	w       io.Writer
	every   time.Duration
	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (s *sparseWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) < s.every {
		s.skipped++
		return len(p), nil
	}
	if s.skipped > 0 {
		fmt.Fprintf(s.w, "kv events: zmq4: (%d more such lines left out)\n", s.skipped)
		s.skipped = 0
	}
	s.last = now
	return s.w.Write(p)
}
