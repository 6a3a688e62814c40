package nccl_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockstep-ai/lockstep/nccl"
)

// startStore serves a store on a loopback ephemeral port for the test.
func startStore(t *testing.T) *nccl.StoreServer {
	t.Helper()
	s, err := nccl.ListenStore("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func dialStore(t *testing.T, addr string) *nccl.StoreClient {
	t.Helper()
	c, err := nccl.DialStore(addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStoreSetGetWait(t *testing.T) {
	noLeaks(t)
	s := startStore(t)
	a, b := dialStore(t, s.Addr()), dialStore(t, s.Addr())

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
	require.NoError(t, b.Set("x", []byte("3")))
	got, err = a.Get("x")
	require.NoError(t, err)
	require.Equal(t, "3", string(got["x"]))

	a.Close()
	b.Close()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
}

// TestStoreCloseWakesWaiters: closing the server fails a blocked Wait at once
// and leaves no goroutine behind.
func TestStoreCloseWakesWaiters(t *testing.T) {
	noLeaks(t)
	s := startStore(t)
	c := dialStore(t, s.Addr())
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
	probe, err := nccl.ListenStore("127.0.0.1:0")
	require.NoError(t, err)
	addr := probe.Addr()
	require.NoError(t, probe.Close())

	start := time.Now()
	_, err = nccl.DialStore(addr, 200*time.Millisecond)
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Less(t, time.Since(start), 3*time.Second)

	var s *nccl.StoreServer
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(100 * time.Millisecond)
		s, err = nccl.ListenStore(addr)
	})
	c, derr := nccl.DialStore(addr, 5*time.Second)
	wg.Wait()
	require.NoError(t, err)
	require.NoError(t, derr)
	require.NoError(t, c.Set("k", []byte(fmt.Sprint(1))))
	c.Close()
	s.Close()
}

// noLeaks checks, after every cleanup of the test has run (it registers
// first, so it runs last), that no goroutine outlives the test.
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}
