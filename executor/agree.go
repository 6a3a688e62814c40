package executor

import (
	"encoding/binary"
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Agree on the forward (executor.md §4): the attention-DP padding dummy, the
// can_queue allgather, and what a pass that is not launched gives back.

// padDummy adds a one-token padding request when this rank has nothing
// schedulable while the fleet has work (§4.2).
func (e *Executor) padDummy() {
	for _, r := range e.active {
		if r.State.InWindow() {
			return
		}
	}
	if e.d.KV.AvailableTokens() < 1 {
		return
	}
	d := e.takeDummy(e.nextDummy)
	if !e.d.KV.AddDummy(&d.Request, 1) {
		e.spareDummies = append(e.spareDummies, d)
		return
	}
	e.nextDummy++
	e.active = append(e.active, d)
	e.index(d)
	e.dummy = d
}

// takeDummy returns a fresh padding dummy with id, in the storage of a
// dummy that ran and left when one is spare (compactActive): on a fleet of
// mostly idle ranks every rank padded a new 500-byte request every
// iteration, a tenth of the twin's allocations at 64 ranks (issue 24 item
// 8). The dummy is new in every respect the spec sees (its id, its KV
// sequence, its state); a dummy rolled back by can_queue false is never
// reused, so its successor is a new object (§4.4, E-07).
func (e *Executor) takeDummy(id uint64) *request {
	n := len(e.spareDummies)
	if n == 0 {
		return newDummy(id)
	}
	r := e.spareDummies[n-1]
	e.spareDummies[n-1] = nil
	e.spareDummies = e.spareDummies[:n-1]
	return resetDummy(r, id)
}

// rollbackDummy removes only the dummy padded in this iteration (§4.4).
func (e *Executor) rollbackDummy() {
	if e.dummy == nil {
		return
	}
	e.d.KV.Free(&e.dummy.Request)
	e.remove(e.dummy)
	e.dummy = nil
}

// canQueue is C5 (§4.3): the fleet runs a forward only if every rank has a batch.
func (e *Executor) canQueue(b int) (canQueue, thisRank bool, err error) {
	if !e.adp() {
		return b > 0, b > 0, nil
	}
	e.wire = binary.LittleEndian.AppendUint64(e.wire[:0], uint64(b))
	t := e.waitStart()
	v, err := e.allGatherDecoded("batch_size", e.wire, decodeCanQueue) // once per fleet in process
	e.waitEnd(t)
	if err != nil {
		return false, false, err
	}
	return v.(bool), b > 0, nil
}

// decodeCanQueue is C5's verdict from every rank's batch size: whether all
// of them have a batch.
func decodeCanQueue(all [][]byte) (any, error) {
	ok := true
	for i, x := range all {
		if len(x) != 8 {
			return false, fmt.Errorf("collective desync: batch size from rank %d has %d bytes", i, len(x))
		}
		ok = ok && binary.LittleEndian.Uint64(x) > 0
	}
	return ok, nil
}

// revertGeneration undoes the KV growth of a pass that is not launched
// (can_queue false): every generation step's growth is reverted (§5 step 8).
//
// Deliberate addition to executor.md §5 step 8: first chunks of the pass are
// released as well (ReleaseContextAdmission: cache closed, position back to
// 0), exactly as the scheduler releases a first chunk that does not end
// SCHEDULED (scheduler.md §7). Without it a CONTEXT_INIT request keeps an
// active cache and its pages after a pass that never launched; it is
// neither evictable nor a recompute candidate (not started), so a generation
// request ahead of it that needs those pages self-evicts forever and the
// rank stalls on a workload whose every request fits the pool alone (issue
// 9, defect 1). Continuation chunks keep their growth: they are started, so
// the ladder can take them.
func (e *Executor) revertGeneration(out *scheduler.Output) {
	for _, r := range out.Generation {
		e.d.KV.RevertAllocateGeneration(r)
	}
	for _, r := range out.Context {
		if r.State == scheduler.ContextInit && !r.IsDummy {
			e.d.KV.ReleaseContextAdmission(r)
		}
	}
}
