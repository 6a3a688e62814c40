package scheduler

import (
	"fmt"
	"strings"
)

// Stall-detector thresholds (spec §15).
const (
	stallWarnEvery = 250
	stallFatal     = 1000
	stallListMax   = 64 // requests listed in the fatal error
)

// detectStall updates the stall counter after a pass (§15). Idle passes (no
// generation visited, no pending context left unpreempted) and passes with
// progress reset it; any other pass is stalled. A Helix sit-out with nothing
// else scheduled is stalled.
func (s *Scheduler) detectStall() error {
	o := &s.out
	progress := len(o.Context)+len(o.Generation)+len(o.Paused)+len(o.RecomputePaused) > 0
	if progress || s.idle() {
		s.stall = 0
		return nil
	}
	s.stall++
	switch {
	case s.stall == 1:
		s.note(LevelDebug, "scheduler made no progress in this pass (%d active requests)", len(s.list))
	case s.stall >= stallFatal:
		return fmt.Errorf("%w: %s%s", ErrStalled, s.summary(), s.stallCause())
	case s.stall%stallWarnEvery == 0:
		s.note(LevelWarn, "scheduler made no progress for %d consecutive passes", s.stall)
	}
	return nil
}

// idle reports a pass with nothing to do: no generation request visited in
// phase 1 and every pending context preempted (or none pending).
func (s *Scheduler) idle() bool {
	if s.genVisited {
		return false
	}
	for _, idx := range s.pending {
		if s.flags[idx]&flagPreempted == 0 {
			return false
		}
	}
	return true
}

// stallCause names the configuration that leaves a full pool no valve, ""
// when it is not the one in use: under MAX_UTILIZATION without recompute
// pause and without a host tier, a request that cannot grow suspends in
// place (§11.3) and frees no page, so a pool filled by growing requests
// never drains.
func (s *Scheduler) stallCause() string {
	if s.cfg.Policy != MaxUtilization || s.cfg.RecomputePause || s.host || s.cfg.Helix {
		return ""
	}
	return fmt.Sprintf("; max_utilization with recompute pause disabled (%s) and no host tier frees no KV page "+
		"under pressure (a request that cannot grow suspends in place): enable recompute pause, give the pool a "+
		"host tier, or use guaranteed_no_evict", s.cfg.Name(SettingRecomputePause))
}

// summary lists the active requests (id, state, KV condition) for the fatal error.
func (s *Scheduler) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d active requests:", len(s.list))
	for j, r := range s.list {
		if j == stallListMax {
			fmt.Fprintf(&b, " … and %d more", len(s.list)-j)
			break
		}
		kv := "none"
		switch {
		case s.kv.IsActive(r.ID):
			kv = "active"
		case s.kv.HasCache(r.ID):
			kv = "suspended"
		}
		fmt.Fprintf(&b, " [id=%d state=%s kv=%s remaining=%d]", r.ID, r.State, kv, r.Remaining())
	}
	return b.String()
}
