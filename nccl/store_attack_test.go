package nccl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The attacks of issue 9 on the bootstrap store, each by a local process
// without the job token on a store that has none (the weakest setting: the
// attacker may claim a free rank). Before the fix every one of them
// succeeded: the store read frames of up to 16 MiB, kept every new key,
// answered a Get of any size and gave a connection forever to send its
// frame.

// attackStore serves a store of a world of size without a token and
// connects an attacker as rank.
func attackStore(t *testing.T, size, rank int, limits StoreLimits) (*StoreServer, *rawConn) {
	t.Helper()
	s, err := ListenStore("127.0.0.1:0", StoreOptions{WorldSize: size, Limits: limits})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c := dialRaw(t, s.Addr())
	require.NoError(t, c.helloAs(storeHelloProto, JobToken{}, rank, size))
	return s, c
}

// TestStoreAttackHugeFrame: a frame announcing 16 MiB is refused from its
// header, before anything is allocated, and the connection is closed.
func TestStoreAttackHugeFrame(t *testing.T) {
	checkNoLeaks(t)
	_, c := attackStore(t, 2, 1, StoreLimits{})
	hdr := binary.LittleEndian.AppendUint32(nil, 16<<20)
	_, err := c.Write(append(hdr, bytes.Repeat([]byte{'S'}, 4096)...))
	require.NoError(t, err)
	resp, err := readFrame(c.r, maxStoreResponse)
	require.NoError(t, err, "the store answers the header at once")
	require.Equal(t, byte(storeRefused), resp[0])
	limit := DefaultStoreLimits(2).requestFrame()
	require.Equal(t, fmt.Sprintf("frame of %d bytes exceeds the %d-byte limit: frame too large", 16<<20, limit), responseMessage(t, resp))
	c.waitClosed(t, 5*time.Second)
}

// TestStoreAttackGrowth: new keys and large values stop at the caps, with a
// refusal naming the key; what the store holds stays within them.
func TestStoreAttackGrowth(t *testing.T) {
	checkNoLeaks(t)
	d := DefaultStoreLimits(2)

	t.Run("value size", func(t *testing.T) {
		_, c := attackStore(t, 2, 1, StoreLimits{})
		resp := c.request(t, storeOpSet, []byte("big/1"), make([]byte, d.MaxValueBytes+1))
		require.Equal(t, byte(storeRefused), resp[0])
		require.Equal(t, `value of 65537 bytes for key "big/1" exceeds the store's 65536-byte limit`, responseMessage(t, resp))
	})

	t.Run("total bytes", func(t *testing.T) {
		s, c := attackStore(t, 2, 1, StoreLimits{})
		value := make([]byte, d.MaxValueBytes)
		refused := 0
		for i := range 2 * d.MaxTotalBytes / d.MaxValueBytes {
			resp := c.request(t, storeOpSet, fmt.Appendf(nil, "grow%d/1", i), value)
			if resp[0] == storeRefused {
				require.Contains(t, responseMessage(t, resp), fmt.Sprintf("over its %d-byte limit", d.MaxTotalBytes))
				refused++
			}
		}
		_, held := s.st.usage()
		require.LessOrEqual(t, held, d.MaxTotalBytes)
		require.Greater(t, refused, d.MaxTotalBytes/d.MaxValueBytes-2)
	})

	t.Run("key count", func(t *testing.T) {
		s, c := attackStore(t, 2, 1, StoreLimits{})
		var last []byte
		for i := range d.MaxKeys + 10 {
			last = c.request(t, storeOpSet, fmt.Appendf(nil, "k%d/1", i), nil)
		}
		require.Equal(t, byte(storeRefused), last[0])
		require.Equal(t, fmt.Sprintf(`the store already holds its limit of %d keys; key "k%d/1" is not stored`, d.MaxKeys, d.MaxKeys+9),
			responseMessage(t, last))
		keys, _ := s.st.usage()
		require.Equal(t, d.MaxKeys, keys)
	})

	t.Run("get amplification", func(t *testing.T) {
		_, c := attackStore(t, 2, 1, StoreLimits{})
		require.Equal(t, []byte{storeOK}, c.request(t, storeOpSet, []byte("v/1"), make([]byte, d.MaxValueBytes)))
		// One request frame of the key ~9 000 times would answer ~600 MB.
		n := (d.requestFrame() - 1) / (4 + len("v/1"))
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = []byte("v/1")
		}
		resp := c.request(t, storeOpGet, keys...)
		require.Equal(t, byte(storeRefused), resp[0])
		require.Contains(t, responseMessage(t, resp), fmt.Sprintf("get of %d keys would answer", n))
	})
}

// TestStoreAttackHalfSentFrames: connections that send part of a frame and
// stall are closed after the handshake or frame timeout, at most
// MaxPendingConns of them are in their hello at once, and a real rank still
// gets in meanwhile.
func TestStoreAttackHalfSentFrames(t *testing.T) {
	checkNoLeaks(t)
	const attackers = 40
	limits := StoreLimits{HandshakeTimeout: 300 * time.Millisecond, FrameTimeout: 300 * time.Millisecond}
	s, authed := attackStore(t, 3, 2, limits)

	// An admitted connection that starts a request and stalls.
	_, err := authed.Write([]byte{200, 0, 0, 0, storeOpSet})
	require.NoError(t, err)

	// Connections that stall in the hello: two bytes of a frame header.
	conns := make([]*rawConn, attackers)
	for i := range conns {
		conns[i] = dialRaw(t, s.Addr())
		_, err := conns[i].Write([]byte{81, 0})
		require.NoError(t, err)
	}
	// At most MaxPendingConns of them are accepted at a time (the others
	// wait in the kernel's backlog), besides the admitted connection.
	tracked := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	require.Never(t, func() bool { return tracked() > defaultStoreMaxPending+1 }, 200*time.Millisecond, 5*time.Millisecond)

	// The real rank 1 is admitted while they stall (it waits in the backlog
	// behind at most MaxPendingConns of them at a time).
	start := time.Now()
	c, err := DialStore(s.Addr(), StoreClientOptions{Rank: 1, WorldSize: 3, Timeout: 10 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Set("lockstep/watchdog/1", []byte("ok")))
	require.Less(t, time.Since(start), 8*time.Second)

	var wg sync.WaitGroup
	for _, a := range append(conns, authed) {
		wg.Go(func() { a.waitClosed(t, 8*time.Second) })
	}
	wg.Wait()
	require.Eventually(t, func() bool { return tracked() == 1 }, 5*time.Second, 5*time.Millisecond,
		"only the real rank's connection is left")
}
