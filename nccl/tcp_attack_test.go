package nccl

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The attacks of issue 9 on rank 0's TCP rendezvous. Before the fix, rank 0
// read the hellos one at a time and gave up the whole rendezvous on the
// first bad one: a bare connect-and-close ended it with "reading a peer's
// hello: EOF", a silent connection held it until its timeout, and a forged
// hello (magic, rank, size) made the forger a rank.

// rendezvousWorld is a world of size ranks whose rank 0 is connecting in the
// background; the test plays the other ranks and the attackers.
type rendezvousWorld struct {
	token  JobToken
	size   int
	store  *StoreServer
	addr   string        // rank 0's data port
	lines  chan string   // rank 0's log
	root   chan rootDone // rank 0's NewTCPTransport result
	client *StoreClient  // rank 0's store client
}

type rootDone struct {
	t   *TCPTransport
	err error
}

func startRendezvous(t *testing.T, size int, token JobToken, connectTimeout time.Duration) *rendezvousWorld {
	t.Helper()
	s, err := ListenStore("127.0.0.1:0", StoreOptions{WorldSize: size, Token: token})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c, err := s.LocalClient(5 * time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	log, lines := newLogLines()
	w := &rendezvousWorld{token: token, size: size, store: s, lines: lines, root: make(chan rootDone, 1), client: c}
	go func() {
		tr, err := NewTCPTransport(TCPOptions{Rank: 0, Size: size, Store: c, Token: token,
			ConnectTimeout: connectTimeout, HelloTimeout: time.Second, Logger: log})
		w.root <- rootDone{tr, err}
	}()
	// Another client of rank 0's to wait with: c is busy with the rendezvous.
	reader, err := s.LocalClient(5 * time.Second)
	require.NoError(t, err)
	defer reader.Close()
	require.NoError(t, reader.Wait([]string{"lockstep/tcp/addr"}, 5*time.Second))
	got, err := reader.Get("lockstep/tcp/addr")
	require.NoError(t, err)
	w.addr = string(got["lockstep/tcp/addr"])
	return w
}

// rank runs a real rank's side of the rendezvous (its own store client).
func (w *rendezvousWorld) rank(t *testing.T, r int) chan rootDone {
	done := make(chan rootDone, 1)
	go func() {
		c, err := DialStore(w.store.Addr(), StoreClientOptions{Rank: r, WorldSize: w.size, Token: w.token, Timeout: 5 * time.Second})
		if err != nil {
			done <- rootDone{nil, err}
			return
		}
		defer c.Close()
		tr, err := NewTCPTransport(TCPOptions{Rank: r, Size: w.size, Store: c, Token: w.token, ConnectTimeout: 5 * time.Second})
		done <- rootDone{tr, err}
	}()
	return done
}

func wait(t *testing.T, ch chan rootDone) rootDone {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("rendezvous hung")
		return rootDone{}
	}
}

// rejected waits for rank 0 to log the rejection of a connection and
// returns the line.
func (w *rendezvousWorld) rejected(t *testing.T) string {
	t.Helper()
	l := nextLine(t, w.lines)
	require.Contains(t, l, "tcp transport: closed a connection that failed the hello")
	return l
}

// TestTCPRendezvousSurvivesAttacks: every connection that fails the hello is
// closed and logged, and the real ranks still form the group; with a token,
// no hello forged without it gets in.
func TestTCPRendezvousSurvivesAttacks(t *testing.T) {
	for _, withToken := range []bool{true, false} {
		name := "without token"
		if withToken {
			name = "with token"
		}
		t.Run(name, func(t *testing.T) {
			checkNoLeaks(t)
			const size = 3
			var token JobToken
			if withToken {
				token = NewJobToken("the job's secret: 0123456789abcdef")
			}
			w := startRendezvous(t, size, token, 8*time.Second)

			// Bare connect-and-close.
			dialRaw(t, w.addr).Close()
			require.Contains(t, w.rejected(t), "closed before completing the hello")

			// Garbage, and a frame header announcing 1 GiB.
			c := dialRaw(t, w.addr)
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
			require.Contains(t, w.rejected(t), "frame of")
			c = dialRaw(t, w.addr)
			c.Write(binary.LittleEndian.AppendUint32(nil, 1<<30))
			require.Contains(t, w.rejected(t), "exceeds the 81-byte limit")

			// A connection that says nothing holds no one up (closed at the
			// end of the rendezvous).
			silent := dialRaw(t, w.addr)

			// A rank outside the world, and a wrong world size, from a
			// process that has the token (or where none is needed).
			c = dialRaw(t, w.addr)
			require.ErrorContains(t, c.helloAs(tcpHelloProto, token, 7, size), "a peer claimed rank 7, outside [1, 3)")
			w.rejected(t)
			c = dialRaw(t, w.addr)
			require.ErrorContains(t, c.helloAs(tcpHelloProto, token, 1, size+1), "rank 0 believes the world has 3 ranks, rank 1 believes 4")
			w.rejected(t)

			if withToken {
				// Hellos from processes without the token: none, a wrong
				// one, and a forged MAC.
				c = dialRaw(t, w.addr)
				err := c.helloAs(tcpHelloProto, JobToken{}, 1, size)
				require.ErrorIs(t, err, ErrAuth)
				require.ErrorContains(t, err, "requires a job token and LOCKSTEP_JOB_TOKEN is not set on rank 1")
				require.Contains(t, w.rejected(t), "has no job token and rank 0 requires one")

				c = dialRaw(t, w.addr)
				err = c.helloAs(tcpHelloProto, NewJobToken("a guess at the job's secret"), 1, size)
				require.ErrorIs(t, err, ErrAuth)
				require.Contains(t, w.rejected(t), "does not prove the job token")

				c = dialRaw(t, w.addr)
				c.challenge(t, tcpHelloProto)
				require.NoError(t, writeFrame(c, forgedHello(tcpHelloProto, 1, size)))
				code, reason := c.verdict(t)
				require.Equal(t, byte(verdictAuth), code)
				require.Contains(t, reason, "(claiming rank 1) does not prove the job token")
				w.rejected(t)
				c.waitClosed(t, 5*time.Second)

				// A store hello at the data port is not a transport hello.
				c = dialRaw(t, w.addr)
				c.Write([]byte{0, 0, 0, 0})
				require.Contains(t, w.rejected(t), "not a lockstep tcp transport hello")
			}

			// The real ranks: rank 1 joins; a second process claiming rank
			// 1 is turned away; rank 2 completes the group.
			r1 := w.rank(t, 1)
			require.Contains(t, nextLine(t, w.lines), "a rank joined the rendezvous map[peer_rank:1")
			c = dialRaw(t, w.addr)
			require.ErrorContains(t, c.helloAs(tcpHelloProto, token, 1, size), "rank 1 is already connected")
			require.Contains(t, w.rejected(t), "rank 1 is already connected")
			r2 := w.rank(t, 2)
			root, d1, d2 := wait(t, w.root), wait(t, r1), wait(t, r2)
			require.NoError(t, root.err)
			require.NoError(t, d1.err)
			require.NoError(t, d2.err)
			silent.waitClosed(t, 5*time.Second)

			ts := []*TCPTransport{root.t, d1.t, d2.t}
			var wg sync.WaitGroup
			for r, tr := range ts {
				wg.Go(func() {
					got, err := tr.AllGatherBytes([]byte{byte(r)})
					require.NoError(t, err)
					require.Equal(t, [][]byte{{0}, {1}, {2}}, got)
				})
			}
			wg.Wait()
			for _, tr := range ts {
				tr.Close()
			}
		})
	}
}

// TestTCPRendezvousTimeoutNamesRejections: a rank whose token differs is
// refused at once, and rank 0's timeout names it (not only its log).
func TestTCPRendezvousTimeoutNamesRejections(t *testing.T) {
	checkNoLeaks(t)
	token := NewJobToken("the job's secret: 0123456789abcdef")
	w := startRendezvous(t, 2, token, 500*time.Millisecond)
	c := dialRaw(t, w.addr)
	err := c.helloAs(tcpHelloProto, NewJobToken("another job's secret: fedcba9876543210"), 1, 2)
	require.ErrorIs(t, err, ErrAuth)
	require.ErrorContains(t, err, "rank 0's tcp transport refused rank 1: the peer (claiming rank 1) does not prove the job token")
	root := wait(t, w.root)
	require.ErrorIs(t, root.err, ErrTimeout)
	require.ErrorContains(t, root.err, "missing [1] (tcp transport rejected 1 connection(s): 127.0.0.1:")
	require.ErrorContains(t, root.err, "LOCKSTEP_JOB_TOKEN differs from rank 0's")
}

// TestHelloNeverSendsTheToken: the bytes both sides of a hello write do not
// contain the token, and every rendering of a token hides it.
func TestHelloNeverSendsTheToken(t *testing.T) {
	checkNoLeaks(t)
	secret := "s3cret-token-value-0123456789"
	token := NewJobToken(secret)
	w := startRendezvous(t, 2, token, 5*time.Second)
	c := dialRaw(t, w.addr)
	var sent bytes.Buffer
	rec := &recordingConn{rawConn: c, sent: &sent}
	hc := helloClient{proto: tcpHelloProto, token: token, rank: 1, size: 2}
	_, err := hc.runHello(rec, c.r)
	require.NoError(t, err)
	root := wait(t, w.root)
	require.NoError(t, root.err)
	defer root.t.Close()
	require.NotContains(t, sent.String(), secret)

	l := Launch{Launcher: LauncherTorchrun, JobToken: token}
	for _, format := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%q"} {
		out := strings.ToLower(fmt.Sprintf(format, l))
		require.NotContains(t, out, "s3cret", format)
		require.NotContains(t, out, hex.EncodeToString([]byte(secret))[:16], format)
	}
	text, err := token.MarshalText()
	require.NoError(t, err)
	require.Equal(t, "[job token set]", string(text))
}

// recordingConn records what the client writes.
type recordingConn struct {
	*rawConn
	sent *bytes.Buffer
}

func (r *recordingConn) Write(b []byte) (int, error) {
	r.sent.Write(b)
	return r.rawConn.Conn.Write(b)
}
