//go:build native

package native

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/nccl"
)

// TestOpenMPISingleton runs the MPI transport as a world of one (no mpirun):
// every collective of the checked protocol, then Close, which finalises MPI
// for this test binary (so this is the only test here that opens MPI). The
// multi-process behaviour is tested under mpirun in tests/mpirun_test.go.
func TestOpenMPISingleton(t *testing.T) {
	tr, err := OpenMPI()
	if errors.Is(err, bridge.ErrUnsupported) {
		require.ErrorContains(t, err, "built without MPI")
		t.Skipf("engine library built without MPI: %v", err)
	}
	require.NoError(t, err)
	require.Equal(t, 0, tr.Rank())
	require.Equal(t, 1, tr.Size())

	got, err := tr.AllGatherBytes([]byte("hello"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("hello")}, got)
	got, err = tr.AllGatherBytes(nil)
	require.NoError(t, err)
	require.Equal(t, [][]byte{{}}, got)

	c := nccl.NewCheckedComm(tr)
	b, err := c.Broadcast("b", 0, []byte("x"))
	require.NoError(t, err)
	require.Equal(t, "x", string(b))
	v, err := c.AllReduceInt64("r", nccl.ReduceMax, []int64{3, -1})
	require.NoError(t, err)
	require.Equal(t, []int64{3, -1}, v)
	_, err = c.Broadcast("bad", 1, nil)
	require.ErrorContains(t, err, "root 1 outside the group [0, 1)")
	require.Len(t, c.Trace(), 3)

	require.NoError(t, c.Close())
	require.NoError(t, tr.Close(), "idempotent")
	_, err = tr.AllGatherBytes(nil)
	require.ErrorIs(t, err, nccl.ErrClosed)

	_, err = OpenMPI()
	require.ErrorIs(t, err, bridge.ErrCommError)
	require.ErrorContains(t, err, "already finalised")
}

// TestNCCLUnsupportedWithoutNCCL: a library built without NCCL (the CPU
// build) links the NCCL entry points and answers ErrUnsupported with a
// message saying how to build it, for the id and for init; bad arguments are
// refused before the library is called. With NCCL built (and no device
// here) the test only checks that errors are clean.
func TestNCCLUnsupportedWithoutNCCL(t *testing.T) {
	id, err := NCCLUniqueID()
	if err == nil {
		require.Len(t, id, 128)
		t.Skip("engine library built with NCCL: the unsupported path is not in this build")
	}
	require.ErrorIs(t, err, bridge.ErrUnsupported)
	require.ErrorContains(t, err, "built without NCCL")
	require.ErrorContains(t, err, "ENGINE_NCCL=ON")

	_, err = OpenNCCL(make([]byte, 128), 0, 2, 0, time.Second)
	require.ErrorIs(t, err, bridge.ErrUnsupported)
	require.ErrorContains(t, err, "built without NCCL")

	_, err = OpenNCCL(make([]byte, 5), 0, 2, 0, time.Second)
	require.EqualError(t, err, "nccl init: the unique id has 5 bytes, want 128")
	_, err = OpenNCCL(make([]byte, 128), 0, 2, 0, 0)
	require.ErrorContains(t, err, "timeout 0s must be between 1ms")

	// Through the process group: every rank fails with rank 0's reason.
	o := NCCLGroupOptions(0, time.Second)
	_, err = o.UniqueID()
	require.ErrorIs(t, err, bridge.ErrUnsupported)
}
