//go:build native

package native

/*
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
)

// CPGroup is an exchange group: engines that join it exchange data inside
// every step (engine.h, "Helix"): attention partials under Helix CP, or
// tokens and expert outputs under expert parallelism (bridge.Config.Expert). Pass it
// as bridge.Config.Helix.Group to Open for each member. NewCPGroup makes an
// in-process group (every member an engine of this process); NewMPICPGroup
// a group of one member per process over MPI.
type CPGroup struct {
	mu   sync.Mutex
	h    C.eng_cp_group_t
	size int
	// local is the only rank this process may join (-1: any, in-process).
	local int
}

// NewCPGroup creates a group of size members; a member that does not arrive
// within timeout fails the others' steps with bridge.ErrTimeout.
func NewCPGroup(size int, timeout time.Duration) (*CPGroup, error) {
	ms := timeout.Milliseconds()
	if ms < 1 || ms > 1<<31-1 {
		return nil, bridge.StatusError("cp_group", bridge.StatusInvalidArgument,
			fmt.Sprintf("timeout %v out of range [1ms, 2^31 ms)", timeout))
	}
	if size < 1 || size > 1<<20 {
		return nil, bridge.StatusError("cp_group", bridge.StatusInvalidArgument, fmt.Sprintf("size must be >= 1, got %d", size))
	}
	g := &CPGroup{size: size, local: -1}
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_cp_group_create(C.int32_t(size), C.int32_t(ms), &g.h); st != C.ENG_OK {
		return nil, bridge.StatusError("cp_group", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return g, nil
}

// NewMPICPGroup creates a group of one member per process over MPI: the
// processes of the MPI world that pass the same color, ranked by world rank;
// this process joins as LocalRank. Collective: every process of the world
// calls it. Members that do not arrive within timeout fail the others' steps
// with bridge.ErrTimeout, naming the exchange and the missing peers. Fails
// with bridge.StatusUnsupported in a build without MPI or when MPI lacks
// MPI_THREAD_MULTIPLE.
func NewMPICPGroup(color int, timeout time.Duration) (*CPGroup, error) {
	ms := timeout.Milliseconds()
	if ms < 1 || ms > 1<<31-1 {
		return nil, bridge.StatusError("cp_group_mpi", bridge.StatusInvalidArgument,
			fmt.Sprintf("timeout %v out of range [1ms, 2^31 ms)", timeout))
	}
	if color < 0 || color > 1<<30 {
		return nil, bridge.StatusError("cp_group_mpi", bridge.StatusInvalidArgument, fmt.Sprintf("color must be in [0, 2^30], got %d", color))
	}
	g := &CPGroup{}
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_cp_group_create_mpi(C.int32_t(color), C.int32_t(ms), &g.h); st != C.ENG_OK {
		return nil, bridge.StatusError("cp_group_mpi", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	g.size = int(C.eng_cp_group_size(g.h))
	g.local = int(C.eng_cp_group_local_rank(g.h))
	return g, nil
}

// LocalRank is the rank this process joins as in a group of one member per
// process, or -1 for an in-process group.
func (g *CPGroup) LocalRank() int { return g.local }

// Size is the number of members.
func (g *CPGroup) Size() int { return g.size }

// Close releases the caller's reference; joined engines keep the group alive.
func (g *CPGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h != nil {
		C.eng_cp_group_free(g.h)
		g.h = nil
	}
	return nil
}

// join makes engine handle h member rank. Runs on the engine goroutine.
func (g *CPGroup) join(e *engine, rank int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h == nil {
		return bridge.StatusError("join_cp", bridge.StatusInvalidArgument, "the CP group was closed before every member joined")
	}
	return e.status("join_cp", C.eng_engine_join_cp(e.h, g.h, C.int32_t(rank)))
}

// joinEP makes engine handle h member rank of the group as an
// expert-parallel group (MoE). Runs on the engine goroutine.
func (g *CPGroup) joinEP(e *engine, rank int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h == nil {
		return bridge.StatusError("join_ep", bridge.StatusInvalidArgument, "the EP group was closed before every member joined")
	}
	return e.status("join_ep", C.eng_engine_join_ep(e.h, g.h, C.int32_t(rank)))
}

// NewTCPCPGroup creates a group of one member per process over TCP, for
// launches without MPI: this process listens on host (an address of this
// node its peers can reach; "" for every interface), gather exchanges every
// member's "host:port" in rank order through the control plane (an
// allgather), and the members connect into a full mesh authenticated by
// secret (the same 32 random bytes on every member, shared through the
// control plane). The mesh must form within timeout, which also bounds
// each exchange. Collective: every member calls it.
func NewTCPCPGroup(rank, size int, host string, secret []byte, timeout time.Duration,
	gather func(addr []byte) ([][]byte, error)) (*CPGroup, error) {
	ms := timeout.Milliseconds()
	if ms < 1 || ms > 1<<31-1 {
		return nil, bridge.StatusError("cp_group_tcp", bridge.StatusInvalidArgument,
			fmt.Sprintf("timeout %v out of range [1ms, 2^31 ms)", timeout))
	}
	if len(secret) != 32 {
		return nil, bridge.StatusError("cp_group_tcp", bridge.StatusInvalidArgument,
			fmt.Sprintf("the secret has %d bytes, want 32", len(secret)))
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, bridge.StatusError("cp_group_tcp", bridge.StatusInvalidArgument,
			fmt.Sprintf("rank %d of %d is out of range", rank, size))
	}
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	chost := C.CString(host)
	defer C.free(unsafe.Pointer(chost))
	var ln C.eng_tcp_listener_t
	var port C.int32_t
	if st := C.eng_tcp_listen(chost, &port, &ln); st != C.ENG_OK {
		return nil, bridge.StatusError("cp_group_tcp", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	defer C.eng_tcp_listener_free(ln)
	advertise := host
	if advertise == "" {
		advertise = "127.0.0.1"
	}
	addrs, err := gather([]byte(net.JoinHostPort(advertise, strconv.Itoa(int(port)))))
	if err != nil {
		return nil, fmt.Errorf("exchanging the exchange group's addresses: %w", err)
	}
	if len(addrs) != size {
		return nil, fmt.Errorf("exchanging the exchange group's addresses: got %d, want %d", len(addrs), size)
	}
	caddrs := C.malloc(C.size_t(size) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(caddrs)
	cs := unsafe.Slice((**C.char)(caddrs), size)
	for i, a := range addrs {
		cs[i] = C.CString(string(a))
		defer C.free(unsafe.Pointer(cs[i]))
	}
	csecret := C.CBytes(secret)
	defer C.free(csecret)
	g := &CPGroup{size: size, local: rank}
	if st := C.eng_cp_group_create_tcp(ln, C.int32_t(rank), C.int32_t(size), (**C.char)(caddrs),
		(*C.uint8_t)(csecret), C.int32_t(ms), &g.h); st != C.ENG_OK {
		return nil, bridge.StatusError("cp_group_tcp", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return g, nil
}
