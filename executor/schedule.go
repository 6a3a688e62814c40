package executor

import (
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Schedule (DESIGN.md §2 step 3): what the executor does with a pass's
// preemptions right after the planner ran (executor.md §11.1–11.2).

// schedule runs the planner on the active list (§5 step 4) and what must
// follow it at once: the scheduler's notes, the Helix schedule check (C4,
// before the recompute reset and canQueue, §11.1, §11.6), the recompute
// resets and the pass's page copies. Requests of the executing batch are
// scheduled normally but are never victims.
func (e *Executor) schedule() (*scheduler.Output, error) {
	e.sched = e.sched[:0]
	for _, r := range e.active {
		e.sched = append(e.sched, &r.Request)
	}
	e.executing = e.executing[:0]
	if e.prev != nil {
		for _, r := range e.prev.reqs {
			e.executing = append(e.executing, r.ID)
		}
	}
	out, err := e.d.Planner.Schedule(e.sched, e.executing)
	if err != nil {
		return nil, err
	}
	if e.cfg.OnNote != nil {
		for _, n := range out.Notes {
			e.cfg.OnNote(e.cfg.Rank, n)
		}
	}
	if e.cfg.ScheduleCheck {
		t := e.waitStart()
		err := checkSchedule(e.d.Comm, summarize(e.iter, out, e.d.KV.Capacity))
		e.waitEnd(t)
		if err != nil {
			return nil, err
		}
	}
	// Recompute victims are reset right after scheduling (§11.1).
	e.handlePaused(out)
	// Page copies of this pass (suspend to / resume from the host tier) go
	// to the engine before any later forward.
	if err := e.submitCopies(); err != nil {
		return nil, err
	}
	return out, nil
}

// handlePaused counts suspensions and resets recompute victims (§11.1–11.2).
func (e *Executor) handlePaused(out *scheduler.Output) {
	for _, s := range out.Paused {
		e.request(s.ID).suspended++
		e.suspends++
	}
	for _, s := range out.RecomputePaused {
		e.recomputes++
		r := e.request(s.ID)
		if e.d.KV.HasCache(r.ID) {
			e.d.KV.Free(&r.Request)
		}
		r.resetForRecompute()
		e.setHelixLocalLen(r)
	}
}

// setHelixLocalLen sets SeqLenThisRankCP = local_len(TotalInputLenCP, cp
// rank) of a (re)admitted Helix request (executor.md §3.5, §11.2).
func (e *Executor) setHelixLocalLen(r *request) {
	if e.cfg.Helix {
		r.SeqLenThisRankCP = kvpool.HelixLocalLen(r.TotalInputLenCP, e.cfg.Rank, e.d.KV.TokensPerPage(), e.cfg.Ranks)
	}
}
