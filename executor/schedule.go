package executor

import (
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Schedule (DESIGN.md §2 step 3): what the executor does with a pass's
// preemptions right after the planner ran (executor.md §11.1–11.2).

// handlePaused counts suspensions and resets recompute victims (§11.1–11.2).
func (e *Executor) handlePaused(out *scheduler.Output) {
	for _, s := range out.Paused {
		e.byID[s.ID].suspended++
		e.suspends++
	}
	for _, s := range out.RecomputePaused {
		e.recomputes++
		r := e.byID[s.ID]
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
