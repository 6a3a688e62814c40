package nccl

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// localTransport is an in-process Transport (the MPI launch's stand-in).
type localTransport struct{ c *LocalComm }

func (m localTransport) Rank() int                                 { return m.c.Rank() }
func (m localTransport) Size() int                                 { return m.c.Size() }
func (m localTransport) AllGatherBytes(p []byte) ([][]byte, error) { return m.c.AllGather("wire", p) }
func (m localTransport) Close() error                              { return m.c.Close() }

// openRanks runs open for every rank in its own goroutine and returns the
// groups and errors; every group is closed at the end of the test.
func openRanks(t *testing.T, size int, open func(r int) (*ProcessGroup, error)) ([]*ProcessGroup, []error) {
	t.Helper()
	groups, errs := make([]*ProcessGroup, size), make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { groups[r], errs[r] = open(r) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for r := size - 1; r >= 0; r-- {
			if groups[r] != nil {
				groups[r].Close()
			}
		}
	})
	return groups, errs
}

// openMPIWorld opens an MPI-launched world (over in-process transports),
// rank r with tokens[r].
func openMPIWorld(t *testing.T, tokens []string) ([]*ProcessGroup, []error) {
	size := len(tokens)
	locals := NewLocalGroup(size, LocalOptions{Timeout: 5 * time.Second})
	return openRanks(t, size, func(r int) (*ProcessGroup, error) {
		l := Launch{Launcher: LauncherOpenMPI, Rank: r, WorldSize: size, LocalRank: r, LocalSize: size,
			JobToken: NewJobToken(tokens[r])}
		return OpenProcessGroup(l, GroupOptions{ConnectTimeout: 5 * time.Second,
			OpenMPI: func() (Transport, error) { return localTransport{locals[r]}, nil }})
	})
}

// TestProcessGroupMPIStoreAuth: under an MPI launch the watchdog's store is
// authenticated even without LOCKSTEP_JOB_TOKEN (by a session token that
// travels through MPI), and a token on some ranks only fails every rank with
// the same error.
func TestProcessGroupMPIStoreAuth(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	t.Run("session token", func(t *testing.T) {
		checkNoLeaks(t)
		groups, errs := openMPIWorld(t, []string{"", "", ""})
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
		require.NoError(t, groups[1].client.Set("lockstep/watchdog/1", []byte("ok")))
		// A process outside the job cannot join the store.
		for _, token := range []JobToken{{}, NewJobToken(secret)} {
			_, err := DialStore(groups[0].server.Addr(), StoreClientOptions{Rank: 2, WorldSize: 3, Token: token, Timeout: time.Second})
			require.ErrorIs(t, err, ErrAuth)
		}
	})
	t.Run("user token", func(t *testing.T) {
		checkNoLeaks(t)
		_, errs := openMPIWorld(t, []string{secret, secret, secret})
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
	})
	t.Run("token on some ranks", func(t *testing.T) {
		checkNoLeaks(t)
		_, errs := openMPIWorld(t, []string{secret, "", secret})
		for r, err := range errs {
			require.ErrorIs(t, err, ErrAuth, "rank %d", r)
			require.EqualError(t, err, fmt.Sprintf("rank %d: LOCKSTEP_JOB_TOKEN is set on ranks [0 2] and not on ranks [1]: set the same token on every rank, or on none", r))
		}
	})
}

// TestProcessGroupBindsMasterAddr: the store and the TCP data port listen on
// MASTER_ADDR only. 127.0.0.2 is a loopback address on Linux that no other
// test uses: nothing answers on 127.0.0.1 at the store's port.
func TestProcessGroupBindsMasterAddr(t *testing.T) {
	checkNoLeaks(t)
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 is not a local address here: %v", err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	const size = 2
	groups, errs := openRanks(t, size, func(r int) (*ProcessGroup, error) {
		l := Launch{Launcher: LauncherTorchrun, Rank: r, WorldSize: size, LocalRank: r, LocalSize: size,
			MasterAddr: "127.0.0.2", MasterPort: port}
		return OpenProcessGroup(l, GroupOptions{ConnectTimeout: 5 * time.Second})
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	require.Equal(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(port)), groups[0].server.Addr())
	got, err := groups[1].client.Get("lockstep/tcp/addr")
	require.NoError(t, err)
	host, _, err := net.SplitHostPort(string(got["lockstep/tcp/addr"]))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.2", host, "the TCP data port")
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err == nil {
		c.Close()
	}
	require.Error(t, err, "nothing listens on 127.0.0.1 at the store's port")
	var opErr *net.OpError
	require.True(t, errors.As(err, &opErr), "%v", err)
}
