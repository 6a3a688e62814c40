//go:build native

package native

/*
#cgo CFLAGS: -I${SRCDIR}/../../native/include
#cgo LDFLAGS: -L${SRCDIR}/../../build/native -lengine_link
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/nccl"
)

// Linking: libengine_link.so in the build directory is a linker script that
// CMake writes: libengine.a followed by the MPI libraries when the library
// was built with ENGINE_MPI (nothing more without), so this package links
// the same way either way.

// mpiRequests carries work to the process's single MPI goroutine. The
// control plane's MPI calls are all made by the thread that initialised MPI
// (all MPI_THREAD_FUNNELED would allow), so one goroutine, locked to its OS
// thread for the life of the process, makes them all. (MPI is initialised
// asking for MPI_THREAD_MULTIPLE, for the engines' exchange groups, which
// run on engine threads over communicators of their own.)
var (
	mpiStart    sync.Once
	mpiRequests chan func()
)

// onMPIThread runs fn on the MPI goroutine and waits for it.
func onMPIThread(fn func()) {
	mpiStart.Do(func() {
		mpiRequests = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread carries MPI's state
			for req := range mpiRequests {
				req()
			}
		}()
	})
	done := make(chan struct{})
	mpiRequests <- func() { fn(); close(done) }
	<-done
}

// MPITransport is an nccl.Transport over the native library's MPI
// communicator (a duplicate of MPI_COMM_WORLD). Wrap it with
// nccl.NewCheckedComm (nccl.OpenProcessGroup does).
//
// A blocked MPI call cannot be cancelled. After a collective timed out
// (nccl.Watchdog) the MPI goroutine stays blocked, Close refuses to free the
// communicator, and the process must exit non-zero; under mpirun that exit
// stops the other ranks.
type MPITransport struct {
	h          C.eng_comm_t // used on the MPI goroutine only
	rank, size int
	lens       []int64 // receive lengths, reused (calls are serialised)

	mu       sync.Mutex // serialises calls; guards closed
	closed   bool
	inFlight atomic.Bool // a call is running on the MPI goroutine
}

var (
	_ nccl.Transport  = (*MPITransport)(nil)
	_ nccl.IdleWaiter = (*MPITransport)(nil)
)

// OpenMPI initialises MPI on first use (MPI_THREAD_MULTIPLE requested, on this
// package's MPI goroutine) and returns a transport over every process of the
// job. Started without mpirun it is a world of one (MPI singleton). MPI can be
// initialised once per process: after the last transport is closed (which
// finalises MPI), OpenMPI fails. A library built without ENGINE_MPI answers
// with an error wrapping bridge.ErrUnsupported.
func OpenMPI() (nccl.Transport, error) {
	t := &MPITransport{}
	var err error
	onMPIThread(func() {
		if st := C.eng_comm_init_mpi(&t.h); st != C.ENG_OK {
			err = bridge.StatusError("mpi init", bridge.Status(st), C.GoString(C.eng_comm_last_error(nil)))
			return
		}
		t.rank, t.size = int(C.eng_comm_rank(t.h)), int(C.eng_comm_size(t.h))
	})
	if err != nil {
		return nil, err
	}
	t.lens = make([]int64, t.size)
	return t, nil
}

// Rank is this process's rank in the world.
func (t *MPITransport) Rank() int { return t.rank }

// Size is the number of processes.
func (t *MPITransport) Size() int { return t.size }

// AllGatherBytes is one eng_comm_allgatherv (one cgo call): the result is
// copied out of the communicator's buffer into one Go allocation, sliced per
// rank.
func (t *MPITransport) AllGatherBytes(payload []byte) ([][]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("mpi transport: %w", nccl.ErrClosed)
	}
	var out [][]byte
	var err error
	t.inFlight.Store(true)
	onMPIThread(func() {
		var send unsafe.Pointer
		if len(payload) > 0 {
			send = unsafe.Pointer(&payload[0]) // read during the call only
		}
		var recv *C.uint8_t
		st := C.eng_comm_allgatherv(t.h, send, C.int64_t(len(payload)),
			(*C.int64_t)(unsafe.Pointer(&t.lens[0])), &recv)
		if st != C.ENG_OK {
			err = bridge.StatusError("mpi allgather", bridge.Status(st), C.GoString(C.eng_comm_last_error(t.h)))
			return
		}
		total := int64(0)
		for _, n := range t.lens {
			total += n
		}
		all := C.GoBytes(unsafe.Pointer(recv), C.int(total))
		out = make([][]byte, t.size)
		off := int64(0)
		for r, n := range t.lens {
			out[r] = all[off : off+n : off+n]
			off += n
		}
	})
	t.inFlight.Store(false)
	return out, err
}

// IdleWait is the idle doorbell (eng_comm_idle_wait, nccl.IdleWaiter): root
// rings every other rank and returns; the others sleep until the ring
// comes, looking every poll (at least 1 µs), for at most timeout.
func (t *MPITransport) IdleWait(root int, poll, timeout time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("mpi transport: %w", nccl.ErrClosed)
	}
	var err error
	t.inFlight.Store(true)
	onMPIThread(func() {
		st := C.eng_comm_idle_wait(t.h, C.int32_t(root), C.int64_t(max(poll.Microseconds(), 1)), C.int64_t(timeout.Microseconds()))
		if st != C.ENG_OK {
			err = bridge.StatusError("mpi idle wait", bridge.Status(st), C.GoString(C.eng_comm_last_error(t.h)))
		}
	})
	t.inFlight.Store(false)
	return err
}

// Abort terminates every process of the job with code (MPI_Abort). If a call
// is blocked on the MPI goroutine, MPI may not be called from another thread,
// so the process exits with code instead (mpirun then stops the others).
// Abort does not return.
func (t *MPITransport) Abort(code int) {
	if t.inFlight.Load() {
		os.Exit(code)
	}
	onMPIThread(func() { C.eng_comm_abort(t.h, C.int32_t(code)) })
	os.Exit(code) // MPI_Abort failed
}

// Close frees the communicator; closing the last one finalises MPI (a
// collective step: every rank should close). It refuses while a call is
// blocked (after a watchdog timeout): exit the process instead. Idempotent.
func (t *MPITransport) Close() error {
	if t.inFlight.Load() {
		return fmt.Errorf("mpi transport: a collective is still blocked in MPI; it cannot be cancelled, exit the process")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	onMPIThread(func() { C.eng_comm_free(t.h) })
	return nil
}

// NCCLTransport is an nccl.Transport over the native library's NCCL
// communicator (eng_comm_init_nccl): host staging on its own stream of the
// rank's device, every wait bounded (past the timeout the NCCL communicator
// is aborted and the call fails with bridge.ErrTimeout naming the
// collective). nccl.OpenProcessGroup uses it through GroupOptions.NCCL
// (NCCLGroupOptions).
type NCCLTransport struct {
	h          C.eng_comm_t
	rank, size int
	lens       []int64

	mu     sync.Mutex // serialises calls; guards closed
	closed bool
}

var _ nccl.Transport = (*NCCLTransport)(nil)

// NCCLUniqueID makes a fresh NCCL unique id (rank 0 of a group). A library
// built without NCCL answers with an error wrapping bridge.ErrUnsupported.
func NCCLUniqueID() ([]byte, error) {
	id := make([]byte, C.ENG_NCCL_UNIQUE_ID_BYTES)
	if st := C.eng_comm_nccl_unique_id((*C.uint8_t)(unsafe.Pointer(&id[0]))); st != C.ENG_OK {
		return nil, bridge.StatusError("nccl unique id", bridge.Status(st), C.GoString(C.eng_comm_last_error(nil)))
	}
	return id, nil
}

// OpenNCCL joins the NCCL group named by id as rank of size on CUDA device
// device (the local rank), every wait bounded by timeout (> 0). A library
// built without NCCL answers with an error wrapping bridge.ErrUnsupported.
func OpenNCCL(id []byte, rank, size, device int, timeout time.Duration) (nccl.Transport, error) {
	if len(id) != C.ENG_NCCL_UNIQUE_ID_BYTES {
		return nil, fmt.Errorf("nccl init: the unique id has %d bytes, want %d", len(id), C.ENG_NCCL_UNIQUE_ID_BYTES)
	}
	ms := timeout.Milliseconds()
	if ms <= 0 || ms > math.MaxInt32 {
		return nil, fmt.Errorf("nccl init: timeout %v must be between 1ms and %dms", timeout, math.MaxInt32)
	}
	runtime.LockOSThread() // NCCL and CUDA calls of one call stay on one thread
	defer runtime.UnlockOSThread()
	t := &NCCLTransport{}
	st := C.eng_comm_init_nccl((*C.uint8_t)(unsafe.Pointer(&id[0])), C.int32_t(rank), C.int32_t(size),
		C.int32_t(device), C.int32_t(ms), &t.h)
	if st != C.ENG_OK {
		return nil, bridge.StatusError("nccl init", bridge.Status(st), C.GoString(C.eng_comm_last_error(nil)))
	}
	t.rank, t.size = int(C.eng_comm_rank(t.h)), int(C.eng_comm_size(t.h))
	t.lens = make([]int64, t.size)
	return t, nil
}

// NCCLGroupOptions is what nccl.OpenProcessGroup needs to run the control
// plane over NCCL on CUDA device `device`, with the native waits bounded by
// timeout (give it more than the watchdog's collective timeout, so that the
// watchdog names a stuck collective first).
func NCCLGroupOptions(device int, timeout time.Duration) *nccl.NCCLOptions {
	return &nccl.NCCLOptions{
		UniqueID: NCCLUniqueID,
		Open: func(id []byte, rank, size int) (nccl.Transport, error) {
			return OpenNCCL(id, rank, size, device, timeout)
		},
	}
}

// Rank is this process's rank in the NCCL group.
func (t *NCCLTransport) Rank() int { return t.rank }

// Size is the group size.
func (t *NCCLTransport) Size() int { return t.size }

// AllGatherBytes is one eng_comm_allgatherv over NCCL (one cgo call).
func (t *NCCLTransport) AllGatherBytes(payload []byte) ([][]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("nccl transport: %w", nccl.ErrClosed)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var send unsafe.Pointer
	if len(payload) > 0 {
		send = unsafe.Pointer(&payload[0]) // read during the call only
	}
	var recv *C.uint8_t
	st := C.eng_comm_allgatherv(t.h, send, C.int64_t(len(payload)), (*C.int64_t)(unsafe.Pointer(&t.lens[0])), &recv)
	if st != C.ENG_OK {
		return nil, bridge.StatusError("nccl allgather", bridge.Status(st), C.GoString(C.eng_comm_last_error(t.h)))
	}
	total := int64(0)
	for _, n := range t.lens {
		total += n
	}
	all := C.GoBytes(unsafe.Pointer(recv), C.int(total))
	out := make([][]byte, t.size)
	off := int64(0)
	for r, n := range t.lens {
		out[r] = all[off : off+n : off+n]
		off += n
	}
	return out, nil
}

// Close frees the NCCL communicator (finalize, or abort when that does not
// complete within the timeout). Idempotent.
func (t *NCCLTransport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	C.eng_comm_free(t.h)
	return nil
}
