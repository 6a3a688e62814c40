package nccl_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// tcpGroup connects size TCP transports (goroutine ranks on loopback) and
// returns them with each rank's store client; everything is closed at the
// end of the test.
func tcpGroup(t *testing.T, size int, opTimeout time.Duration) []*nccl.TCPTransport {
	t.Helper()
	token := nccl.NewJobToken("tcp group test token, 32 bytes+")
	s := startStore(t, nccl.StoreOptions{WorldSize: size, Token: token})
	cs := storeClients(t, s, size, token)
	ts := make([]*nccl.TCPTransport, size)
	errs := runAll(t, size, func(r int) error {
		var err error
		ts[r], err = nccl.NewTCPTransport(nccl.TCPOptions{Rank: r, Size: size, Store: cs[r], Token: token,
			Host: "127.0.0.1", ConnectTimeout: 5 * time.Second, OpTimeout: opTimeout})
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	return ts
}

func TestTCPCollectives(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("size", size), func(t *testing.T) {
			noLeaks(t)
			ts := tcpGroup(t, size, 0)
			comms := make([]*nccl.CheckedComm, size)
			for r, tr := range ts {
				comms[r] = nccl.NewCheckedComm(tr)
			}
			errs := runAll(t, size, func(r int) error {
				for range 3 {
					if err := exerciseCollectives(comms[r]); err != nil {
						return err
					}
				}
				// A large payload goes through the star intact.
				big := bytes.Repeat([]byte{byte(r)}, 3<<20)
				got, err := comms[r].AllGather("big", big)
				if err != nil {
					return err
				}
				for p := range size {
					if !bytes.Equal(got[p], bytes.Repeat([]byte{byte(p)}, 3<<20)) {
						return fmt.Errorf("big[%d] corrupted", p)
					}
				}
				return nil
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			for r := 1; r < size; r++ {
				require.Equal(t, comms[0].Trace(), comms[r].Trace())
			}
			for _, c := range comms {
				require.NoError(t, c.Close())
			}
		})
	}
}

// TestTCPMismatch: the checked protocol over TCP reports a desync on every rank.
func TestTCPMismatch(t *testing.T) {
	noLeaks(t)
	ts := tcpGroup(t, 4, 0)
	errs := runAll(t, 4, func(r int) error {
		c := nccl.NewCheckedComm(ts[r])
		var err error
		if r == 2 {
			_, err = c.Broadcast("arrivals", 0, nil)
		} else {
			_, err = c.AllGather("batch_size", nil)
		}
		return err
	})
	for r, err := range errs {
		require.ErrorIs(t, err, nccl.ErrMismatch, "rank %d", r)
		require.EqualError(t, err, `collective #0 mismatch: rank 0 entered allgather:"batch_size", rank 2 entered broadcast:"arrivals"`)
	}
}

// TestTCPPeerGone: a rank that closes fails its peers with ErrClosed, and the
// op timeout bounds a rank that never sends.
func TestTCPPeerGone(t *testing.T) {
	noLeaks(t)
	ts := tcpGroup(t, 3, 0)
	require.NoError(t, ts[2].Close())
	errs := runAll(t, 2, func(r int) error { _, err := ts[r].AllGatherBytes([]byte("x")); return err })
	require.ErrorIs(t, errs[0], nccl.ErrClosed)
	require.Contains(t, errs[0].Error(), "with rank 2")
	require.ErrorIs(t, errs[1], nccl.ErrClosed, "rank 1 loses rank 0, which gave up")

	ts = tcpGroup(t, 2, 200*time.Millisecond)
	start := time.Now()
	_, err := ts[0].AllGatherBytes(nil) // rank 1 never calls
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Less(t, time.Since(start), 3*time.Second)
}

// TestTCPRendezvousFailures: a missing rank and a wrong world size are
// reported within the connect timeout; the rank with the wrong size fails at
// once, and rank 0 names it in its timeout.
func TestTCPRendezvousFailures(t *testing.T) {
	noLeaks(t)
	s := startStore(t, nccl.StoreOptions{WorldSize: 3})
	c := localStore(t, s)
	start := time.Now()
	_, err := nccl.NewTCPTransport(nccl.TCPOptions{Rank: 0, Size: 3, Store: c, ConnectTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, nccl.ErrTimeout)
	require.Contains(t, err.Error(), "missing [1 2]")
	require.Less(t, time.Since(start), 3*time.Second)

	s2 := startStore(t, nccl.StoreOptions{WorldSize: 2})
	cs := storeClients(t, s2, 2, nccl.JobToken{})
	elapsed := make([]time.Duration, 2)
	errs := runAll(t, 2, func(r int) error {
		size := 2
		if r == 1 {
			size = 3
		}
		start := time.Now()
		tr, err := nccl.NewTCPTransport(nccl.TCPOptions{Rank: r, Size: size, Store: cs[r], Key: "k", ConnectTimeout: time.Second})
		elapsed[r] = time.Since(start)
		if err == nil {
			tr.Close()
		}
		return err
	})
	require.ErrorIs(t, errs[0], nccl.ErrTimeout)
	require.ErrorContains(t, errs[0], "missing [1] (tcp transport rejected 1 connection(s): 127.0.0.1:")
	require.ErrorContains(t, errs[0], "rank 1 believes the world has 3 ranks, rank 0 believes 2")
	require.ErrorContains(t, errs[1], "rank 0 believes the world has 2 ranks, rank 1 believes 3")
	require.Less(t, elapsed[1], 900*time.Millisecond, "the misplaced rank fails at once")

	_, err = nccl.NewTCPTransport(nccl.TCPOptions{Rank: 2, Size: 2})
	require.ErrorContains(t, err, "rank 2 of size 2 is not a valid placement")
}
