package executor

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// CostPublisher is a planner that takes the online calibrator's
// publications (scheduler.Scheduler in ctx_cost.mode auto). New requires
// it of Deps.Planner when Config.CostCalibration is set, so a wrapper
// planner must forward it.
type CostPublisher interface {
	PublishCost(o, d int64) error
}

// calibrator is the executor's side of the online context-cost calibrator
// (router-and-calibration.md §9–§10): every iteration, every rank feeds the
// same gathered statistics of the previous iteration — every rank's tokens,
// attention work, iteration time and context tokens, which the rank-state
// allgather (C1) already carries — into its own costfit.Calibrator, so with
// the lockstep correction every rank publishes the same (O, D, B) at the
// same iteration, and hands each publication to the scheduler.
type calibrator struct {
	cal      *costfit.Calibrator
	samples  []costfit.RankSample
	lastIter int64 // StatsIter last observed
	current  *costfit.Publication
	fresh    bool // a publication was made in this iteration (logged in its record)
}

func newCalibrator(s costfit.Settings) (*calibrator, error) {
	c, err := costfit.New(s)
	if err != nil {
		return nil, err
	}
	return &calibrator{cal: c, lastIter: -1}, nil
}

// observe feeds the gathered states of the previous iteration (every rank's,
// under attention DP; this rank's alone otherwise) and publishes a new
// (O, D) to the planner when the calibrator refits to one. The states must
// be identical on every rank (they are the C1 allgather), and so are the
// decisions. An iteration in which some rank has no statistics, or ranks
// report different iterations, is not observed.
func (e *Executor) observeCost(states []RankState) error {
	c := e.calib
	c.fresh = false
	if len(states) == 0 {
		return nil
	}
	it := states[0].StatsIter
	for _, s := range states {
		if !s.HasStats || s.StatsIter != it {
			return nil
		}
	}
	if it <= c.lastIter {
		return nil
	}
	c.lastIter = it
	c.samples = c.samples[:0]
	self := 0
	for i, s := range states {
		if int(s.Rank) == e.cfg.Rank {
			self = i
		}
		c.samples = append(c.samples, costfit.RankSample{N: s.CtxTokens + s.GenTokens, S: s.CostS,
			WallMS: float64(s.HostUS) / 1000, CtxTokens: s.CtxTokens})
	}
	pub, changed := c.cal.ObserveFleet(it, self, c.samples)
	if !changed {
		return nil
	}
	if err := e.costPub.PublishCost(pub.Offset, pub.Threshold); err != nil {
		return fmt.Errorf("ctx_cost auto: publishing O=%d D=%d: %w", pub.Offset, pub.Threshold, err)
	}
	c.current, c.fresh = &pub, true
	e.res.CostPublications = append(e.res.CostPublications, pub)
	if e.cfg.OnNote != nil {
		// Every rank publishes the same values at the same iteration with
		// the lockstep correction: rank 0 says it at info level.
		level := scheduler.LevelInfo
		if e.cfg.Rank != 0 && c.cal.Settings().LockstepCorrection {
			level = scheduler.LevelDebug
		}
		e.cfg.OnNote(e.cfg.Rank, scheduler.Note{Level: level, Text: fmt.Sprintf(
			"ctx_cost auto: published kv_cost_offset=%d kv_depth_threshold=%d budget=%d (A=%.1f ms, c2=%.3g ms per token·KV, %d observations, stats of iteration %d)",
			pub.Offset, pub.Threshold, pub.Budget, pub.A, pub.C2, pub.Observations, it)})
	}
	return nil
}
