//go:build native

package native

/*
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// CPGroup is an in-process Helix context-parallel group: engines that join it
// exchange attention partials inside every step (engine.h, "Helix"). Pass it
// as bridge.Config.Helix.Group to Open for each member.
type CPGroup struct {
	mu   sync.Mutex
	h    C.eng_cp_group_t
	size int
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
	g := &CPGroup{size: size}
	runtime.LockOSThread() // eng_last_error is thread-local
	defer runtime.UnlockOSThread()
	if st := C.eng_cp_group_create(C.int32_t(size), C.int32_t(ms), &g.h); st != C.ENG_OK {
		return nil, bridge.StatusError("cp_group", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return g, nil
}

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
