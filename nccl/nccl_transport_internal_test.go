package nccl

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeNCCL stands in for bridge/native's NCCL functions: UniqueID counts its
// calls, Open records the id each rank got and returns an in-process
// transport of a second local group (the "NCCL" one), or openErr.
type fakeNCCL struct {
	ids      atomic.Int32
	mu       sync.Mutex
	gotIDs   map[int][]byte
	locals   []*LocalComm
	idErr    error
	openErr  error
	fallback bool
	closed   atomic.Int32
}

type closeCounting struct {
	localTransport
	n *atomic.Int32
}

func (c closeCounting) Close() error { c.n.Add(1); return c.localTransport.Close() }

func (f *fakeNCCL) options() *NCCLOptions {
	return &NCCLOptions{
		Fallback: f.fallback,
		UniqueID: func() ([]byte, error) {
			f.ids.Add(1)
			if f.idErr != nil {
				return nil, f.idErr
			}
			return bytes.Repeat([]byte{7}, NCCLIDBytes), nil
		},
		Open: func(id []byte, rank, size int) (Transport, error) {
			f.mu.Lock()
			f.gotIDs[rank] = append([]byte(nil), id...)
			f.mu.Unlock()
			if f.openErr != nil {
				return nil, f.openErr
			}
			return closeCounting{localTransport{f.locals[rank]}, &f.closed}, nil
		},
	}
}

// openNCCLWorld opens an MPI-launched world of size ranks (in-process
// bootstrap transports) with the fake NCCL options (nil: without NCCL).
func openNCCLWorld(t *testing.T, size int, f *fakeNCCL) ([]*ProcessGroup, []error) {
	boot := NewLocalGroup(size, LocalOptions{Timeout: 5 * time.Second})
	if f != nil {
		f.gotIDs = map[int][]byte{}
		f.locals = NewLocalGroup(size, LocalOptions{Timeout: 5 * time.Second})
	}
	return openRanks(t, size, func(r int) (*ProcessGroup, error) {
		l := Launch{Launcher: LauncherOpenMPI, Rank: r, WorldSize: size, LocalRank: r, LocalSize: size}
		o := GroupOptions{ConnectTimeout: 5 * time.Second,
			OpenMPI: func() (Transport, error) { return localTransport{boot[r]}, nil }}
		if f != nil {
			o.NCCL = f.options()
		}
		return OpenProcessGroup(l, o)
	})
}

// TestProcessGroupSelectsNCCL: with NCCL options the checked protocol runs
// over the NCCL transport, bootstrapped by one id from rank 0 that every rank
// receives; without them the CPU transport (MPI here) carries it.
func TestProcessGroupSelectsNCCL(t *testing.T) {
	t.Run("nccl", func(t *testing.T) {
		checkNoLeaks(t)
		f := &fakeNCCL{}
		groups, errs := openNCCLWorld(t, 3, f)
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
			require.Equal(t, "nccl", groups[r].Transport, "rank %d", r)
		}
		require.Equal(t, int32(1), f.ids.Load(), "only rank 0 makes the unique id")
		for r := range 3 {
			require.Equal(t, bytes.Repeat([]byte{7}, NCCLIDBytes), f.gotIDs[r], "rank %d got rank 0's id", r)
		}
		// A collective of the checked protocol goes through the NCCL group:
		// its trace on the fake NCCL transport grows, the bootstrap's does not.
		bootCalls := f.locals[0].Trace()
		var wg sync.WaitGroup
		outs := make([][][]byte, 3)
		for r := range 3 {
			wg.Go(func() {
				var err error
				outs[r], err = groups[r].Comm.AllGather("rank_state", []byte{byte(r)})
				require.NoError(t, err)
			})
		}
		wg.Wait()
		require.Equal(t, [][]byte{{0}, {1}, {2}}, outs[1])
		require.Greater(t, len(f.locals[0].Trace()), len(bootCalls))
		for r := range 3 {
			require.NoError(t, groups[r].Close())
			groups[r] = nil
		}
		require.Equal(t, int32(3), f.closed.Load(), "Close leaves the NCCL group on every rank")
	})
	t.Run("cpu transports without NCCL", func(t *testing.T) {
		checkNoLeaks(t)
		groups, errs := openNCCLWorld(t, 2, nil)
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
			require.Equal(t, "mpi", groups[r].Transport)
		}
	})
	t.Run("rank 0 cannot make an id", func(t *testing.T) {
		checkNoLeaks(t)
		f := &fakeNCCL{idErr: errors.New("engine library built without NCCL")}
		_, errs := openNCCLWorld(t, 3, f)
		for r, err := range errs {
			require.EqualError(t, err, "nccl transport: rank 0 could not make the NCCL unique id: engine library built without NCCL", "rank %d", r)
		}
		require.Empty(t, f.gotIDs, "no rank opens NCCL without an id")
	})
	t.Run("fallback when rank 0 has no NCCL", func(t *testing.T) {
		checkNoLeaks(t)
		f := &fakeNCCL{idErr: errors.New("engine library built without NCCL"), fallback: true}
		groups, errs := openNCCLWorld(t, 3, f)
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
			require.Equal(t, "mpi", groups[r].Transport, "rank %d keeps the CPU transport", r)
		}
		require.Empty(t, f.gotIDs)
	})
	t.Run("open fails", func(t *testing.T) {
		checkNoLeaks(t)
		unsupported := errors.New("unsupported")
		f := &fakeNCCL{openErr: unsupported}
		_, errs := openNCCLWorld(t, 2, f)
		for r, err := range errs {
			require.ErrorIs(t, err, unsupported, "rank %d", r)
			require.ErrorContains(t, err, "nccl transport: rank")
		}
	})
}
