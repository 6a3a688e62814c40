package nccl_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockstep-ai/lockstep/nccl"
)

// testWorld is the world size of the store tests that do not choose one.
const testWorld = 4

// startStore serves a store on a loopback ephemeral port for the test (a
// world of testWorld ranks unless o says otherwise).
func startStore(t *testing.T, o nccl.StoreOptions) *nccl.StoreServer {
	t.Helper()
	if o.WorldSize == 0 {
		o.WorldSize = testWorld
	}
	s, err := nccl.ListenStore("127.0.0.1:0", o)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// localStore returns rank 0's in-process client of s.
func localStore(t *testing.T, s *nccl.StoreServer) *nccl.StoreClient {
	t.Helper()
	c, err := s.LocalClient(5 * time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// dialStore connects rank (≥ 1) of a world of testWorld ranks, without a
// token.
func dialStore(t *testing.T, addr string, rank int) *nccl.StoreClient {
	t.Helper()
	c, err := nccl.DialStore(addr, nccl.StoreClientOptions{Rank: rank, WorldSize: testWorld, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// storeClients returns one client per rank of s's world of size: rank 0's
// in process, the others over TCP with token.
func storeClients(t *testing.T, s *nccl.StoreServer, size int, token nccl.JobToken) []*nccl.StoreClient {
	t.Helper()
	cs := []*nccl.StoreClient{localStore(t, s)}
	for r := 1; r < size; r++ {
		c, err := nccl.DialStore(s.Addr(), nccl.StoreClientOptions{Rank: r, WorldSize: size, Token: token, Timeout: 5 * time.Second})
		require.NoError(t, err, "rank %d", r)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func TestStoreSetGetWait(t *testing.T) {
	noLeaks(t)
	s := startStore(t, nccl.StoreOptions{})
	a, b := localStore(t, s), dialStore(t, s.Addr(), 1)

	got, err := a.Get("x", "y")
	require.NoError(t, err)
	require.Empty(t, got)

	require.NoError(t, a.Set("x", []byte("1")))
	require.NoError(t, a.Set("empty", nil))
	got, err = b.Get("x", "y", "empty")
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"x": []byte("1"), "empty": {}}, got)

	// Wait returns when a later Set arrives from another client.
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(50 * time.Millisecond)
		a.Set("y", []byte("2"))
	})
	require.NoError(t, b.Wait([]string{"x", "y"}, 5*time.Second))
	wg.Wait()

	// A wait that times out names the missing keys, and the client stays usable.
	start := time.Now()
	err = b.Wait([]string{"x", "never", "also_never"}, 100*time.Millisecond)
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Contains(t, err.Error(), `keys ["also_never" "never"] not set within 100ms`)
	require.Less(t, time.Since(start), 3*time.Second)
	// A status key is rewritable by its owner.
	require.NoError(t, b.Set("status/1", []byte("3")))
	require.NoError(t, b.Set("status/1", []byte("4")))
	got, err = a.Get("status/1")
	require.NoError(t, err)
	require.Equal(t, "4", string(got["status/1"]))

	a.Close()
	b.Close()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
}

// TestStoreOwnership: the ownership rule. Rendezvous keys are rank 0's and
// written once; status keys ("<prefix>/<rank>") are their rank's; a TCP
// connection can act neither for rank 0 nor for a rank another connection
// holds. Before the rule, any connection could overwrite lockstep/tcp/addr
// and route rank 1 through itself.
func TestStoreOwnership(t *testing.T) {
	noLeaks(t)
	s := startStore(t, nccl.StoreOptions{})
	cs := storeClients(t, s, testWorld, nccl.JobToken{})
	const addrKey = "lockstep/tcp/addr"
	require.NoError(t, cs[0].Set(addrKey, []byte("127.0.0.1:1111")))

	for _, tc := range []struct {
		name  string
		rank  int
		key   string
		error string
	}{
		{"overwrite of the tcp address by another rank", 1, addrKey,
			`key "lockstep/tcp/addr" is a rendezvous key, which only rank 0 writes; rank 1 may not write it`},
		{"second write of a rendezvous key", 0, addrKey,
			`rendezvous key "lockstep/tcp/addr" is already set; rendezvous keys are written once`},
		{"new rendezvous key by another rank", 2, "lockstep/nccl/uid",
			`key "lockstep/nccl/uid" is a rendezvous key, which only rank 0 writes; rank 2 may not write it`},
		{"another rank's status", 2, "lockstep/watchdog/1",
			`key "lockstep/watchdog/1" is rank 1's status key; rank 2 may not write it`},
		{"rank 0's status", 3, "lockstep/watchdog/0",
			`key "lockstep/watchdog/0" is rank 0's status key; rank 3 may not write it`},
		{"a rank outside the world", 1, "lockstep/watchdog/4",
			`key "lockstep/watchdog/4" names rank 4, outside the world of 4 ranks`},
		{"empty key", 1, "", "empty key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cs[tc.rank].Set(tc.key, []byte("127.0.0.1:6666"))
			require.ErrorIs(t, err, nccl.ErrStoreRefused)
			require.ErrorContains(t, err, tc.error)
		})
	}
	got, err := cs[1].Get(addrKey)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1111", string(got[addrKey]), "the address is rank 0's first write")

	// Status keys: the owner rewrites its own; a key with a non-canonical
	// rank ("01") is a rendezvous key, not rank 1's.
	for range 3 {
		require.NoError(t, cs[1].Set("lockstep/watchdog/1", []byte("busy")))
		require.NoError(t, cs[0].Set("lockstep/watchdog/0", []byte("busy")))
	}
	require.ErrorIs(t, cs[1].Set("lockstep/watchdog/01", nil), nccl.ErrStoreRefused)

	// No TCP connection acts for rank 0, or for a rank already connected.
	for _, tc := range []struct {
		rank  int
		error string
	}{
		{0, "a peer claimed rank 0, outside [1, 4) (rank 0 is this process; check RANK)"},
		{1, "rank 1 is already connected to the store"},
		{4, "a peer claimed rank 4, outside [1, 4)"},
	} {
		_, err := nccl.DialStore(s.Addr(), nccl.StoreClientOptions{Rank: tc.rank, WorldSize: testWorld, Timeout: time.Second})
		require.ErrorContains(t, err, tc.error, "rank %d", tc.rank)
	}
	// Once rank 3's connection closes, rank 3 may connect again.
	cs[3].Close()
	require.Eventually(t, func() bool {
		c, err := nccl.DialStore(s.Addr(), nccl.StoreClientOptions{Rank: 3, WorldSize: testWorld, Timeout: time.Second})
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
}

// TestStoreLargeGetIsSplit: a Get of more keys than one request can carry is
// split by the client, so that the store's request limit costs a legitimate
// caller (the watchdog's snapshot of a large world) nothing.
func TestStoreLargeGetIsSplit(t *testing.T) {
	noLeaks(t)
	s := startStore(t, nccl.StoreOptions{WorldSize: 2, Limits: nccl.StoreLimits{MaxValueBytes: 100, MaxKeyBytes: 40}})
	cs := storeClients(t, s, 2, nccl.JobToken{})
	require.NoError(t, cs[0].Set("lockstep/a", []byte("A")))
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = fmt.Sprintf("lockstep/missing-key-%03d", i)
	}
	keys[250] = "lockstep/a"
	got, err := cs[1].Get(keys...)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"lockstep/a": []byte("A")}, got)
	require.NoError(t, cs[1].Wait([]string{"lockstep/a", "lockstep/a", "lockstep/a"}, time.Second))
	err = cs[1].Wait(keys, 50*time.Millisecond)
	require.ErrorIs(t, err, nccl.ErrTimeout)

	// What cannot fit in any request is refused before it is sent.
	err = cs[0].Set("lockstep/big", []byte(strings.Repeat("x", 200)))
	require.ErrorIs(t, err, nccl.ErrStoreRefused)
	require.ErrorContains(t, err, "exceeds the store's")
	_, err = cs[1].Get(strings.Repeat("k", 300))
	require.ErrorIs(t, err, nccl.ErrStoreRefused)
}

// TestStoreCloseWakesWaiters: closing the server fails a blocked Wait at once
// and leaves no goroutine behind.
func TestStoreCloseWakesWaiters(t *testing.T) {
	noLeaks(t)
	s := startStore(t, nccl.StoreOptions{})
	c := dialStore(t, s.Addr(), 1)
	errc := make(chan error, 1)
	go func() { errc <- c.Wait([]string{"k"}, time.Minute) }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, s.Close())
	select {
	case err := <-errc:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still blocked after the server closed")
	}
	c.Close()
}

// TestStoreDialRetries: a client may start before the server; it keeps
// dialing until the timeout.
func TestStoreDialRetries(t *testing.T) {
	noLeaks(t)
	probe, err := nccl.ListenStore("127.0.0.1:0", nccl.StoreOptions{WorldSize: 2})
	require.NoError(t, err)
	addr := probe.Addr()
	require.NoError(t, probe.Close())

	start := time.Now()
	opts := nccl.StoreClientOptions{Rank: 1, WorldSize: 2, Timeout: 200 * time.Millisecond}
	_, err = nccl.DialStore(addr, opts)
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Less(t, time.Since(start), 3*time.Second)

	var s *nccl.StoreServer
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(100 * time.Millisecond)
		s, err = nccl.ListenStore(addr, nccl.StoreOptions{WorldSize: 2})
	})
	opts.Timeout = 5 * time.Second
	c, derr := nccl.DialStore(addr, opts)
	wg.Wait()
	require.NoError(t, err)
	require.NoError(t, derr)
	require.NoError(t, c.Set("k/1", []byte(fmt.Sprint(1))))
	c.Close()
	s.Close()
}

// TestStoreListensWhereTold: an address without a host (every interface) is
// refused, and the store's address is the host it was given.
func TestStoreListensWhereTold(t *testing.T) {
	noLeaks(t)
	_, err := nccl.ListenStore(":0", nccl.StoreOptions{WorldSize: 2})
	require.ErrorContains(t, err, "names no host")
	s := startStore(t, nccl.StoreOptions{})
	require.True(t, strings.HasPrefix(s.Addr(), "127.0.0.1:"), s.Addr())
}

// noLeaks checks, after every cleanup of the test has run (it registers
// first, so it runs last), that no goroutine outlives the test.
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// TestStoreReportsAGoneRank: rank 0 learns at once that a rank's
// connection closed (its process left or was killed), naming the rank; not
// after the server itself closed (issue 23, defect 13).
func TestStoreReportsAGoneRank(t *testing.T) {
	s := startStore(t, nccl.StoreOptions{})
	gone := make(chan int, 4)
	s.OnRankGone(func(rank int) { gone <- rank })
	c1 := dialStore(t, s.Addr(), 1)
	c2 := dialStore(t, s.Addr(), 2)
	c2.Close()
	select {
	case r := <-gone:
		require.Equal(t, 2, r)
	case <-time.After(5 * time.Second):
		t.Fatal("the gone rank was not reported")
	}
	require.NoError(t, s.Close())
	c1.Close()
	select {
	case r := <-gone:
		t.Fatalf("rank %d reported after the server closed", r)
	case <-time.After(100 * time.Millisecond):
	}
}
