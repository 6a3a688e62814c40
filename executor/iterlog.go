package executor

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// IterRecord is one line of the per-rank iteration log (executor.md §13.2).
type IterRecord struct {
	V        int   `json:"v"`
	Rank     int   `json:"rank"`
	DPRank   *int  `json:"dp_rank"`
	CPRank   *int  `json:"cp_rank"`
	Iter     int64 `json:"iter"`
	TSUnixMS int64 `json:"ts_unix_ms"`
	// HostMS is the measured host CPU time of the iteration on this rank:
	// the executor loop thread's CPU clock (internal/cputime) from the
	// iteration's start to the end of its own work, on every engine (the
	// engine's compute runs elsewhere: the native engine's own thread, the
	// GPU, the twin's model). Wall time where no thread CPU clock exists.
	HostMS float64 `json:"host_ms"`
	// IterMS is the iteration's wall time on this rank (what host_ms held
	// before issue 24): host work, the device step it waited for, and the
	// collectives.
	IterMS   float64  `json:"iter_ms"`
	DeviceMS *float64 `json:"device_ms"`
	// MoEWaitMS (MoE models only) is the part of device_ms this rank's
	// engine spent in MoE exchanges (dispatch and combine): waiting for the
	// slowest rank's layer and moving tokens. device_ms − moe_wait_ms is
	// the rank's compute.
	MoEWaitMS *float64 `json:"moe_wait_ms,omitempty"`
	// FleetDeviceMS is the fleet's time for this iteration's forward: the
	// slowest rank's device time, which every rank of the lockstep waits
	// for, dense and MoE alike (null without a forward). It is the
	// iteration time the offline calibration fits (docs/calibration.md):
	// device_ms is this rank's own time, which for a dense model leaves the
	// lockstep wait out (that wait is in wait_ms). With a virtual clock it
	// is the modelled fleet step; otherwise the largest of this rank's
	// device_ms and every rank's busy time, gathered with the responses.
	FleetDeviceMS *float64 `json:"fleet_device_ms"`
	// TokenBalance (attention DP) is the token balance of this record's
	// forward: mean/max over the ranks of the real tokens in their batch
	// (padding dummies count 0); absent without a forward, without
	// attention DP, or when no rank had a real token.
	TokenBalance      *float64 `json:"token_balance,omitempty"`
	WaitMS            float64  `json:"wait_ms"`
	CanQueue          bool     `json:"can_queue"`
	ADPDummy          bool     `json:"adp_dummy"`
	NumCtxRequests    int      `json:"num_ctx_requests"`
	CtxTokens         int      `json:"ctx_tokens"`
	CtxRequestIDs     []uint64 `json:"ctx_request_ids"`
	CtxKVStart        []int    `json:"ctx_kv_start"`
	CtxChunkTokens    []int    `json:"ctx_chunk_tokens"`
	CtxCachedKVTokens int      `json:"ctx_cached_kv_tokens"`
	NumGenRequests    int      `json:"num_gen_requests"`
	GenTokens         int      `json:"gen_tokens"`
	// GenKVTokens is Σ over generation requests of the KV they attend to
	// (prompt + generated so far): the decode attention work of the step.
	GenKVTokens        int       `json:"gen_kv_tokens"`
	CostS              float64   `json:"cost_s"`
	NumPaused          int       `json:"num_paused"`
	NumRecomputePaused int       `json:"num_recompute_paused"`
	NumSatOut          int       `json:"num_sat_out"`
	NumDeferred        int       `json:"num_deferred"`
	NumDemoted         int       `json:"num_demoted"`
	StallCount         int       `json:"stall_count"`
	KVUtil             float64   `json:"kv_util"`
	MaxNumTokens       *int      `json:"max_num_tokens"`
	Cost               *costInfo `json:"cost"`
	// CostPublication is the online calibrator's publication made at the
	// start of this iteration (ctx_cost.mode auto), absent otherwise.
	CostPublication *costPublication `json:"cost_publication,omitempty"`
	EventsDropped   int              `json:"events_dropped"`

	timed   bool    // host_ms and wait_ms already measured (overlap loop)
	fleetMS float64 // virtual clock: the fleet's duration of this record's step
}

// costPublication is one publication of the online calibrator.
type costPublication struct {
	Offset       int64   `json:"offset"`
	Threshold    int64   `json:"threshold"`
	Budget       int64   `json:"budget"`
	A            float64 `json:"a_ms"`
	C2           float64 `json:"c2_ms_per_token_kv"`
	Observations int64   `json:"observations"`
}

type costInfo struct {
	Offset    int64 `json:"offset"`
	Threshold int64 `json:"threshold"`
	R         int64 `json:"r"`
	Budget    int64 `json:"budget"`
	Used      int64 `json:"used"`
}

// newIterRecord fills the plan-derived fields right after scheduling (before
// the step changes positions).
func (e *Executor) newIterRecord(start time.Time, out *scheduler.Output, canQueue bool) *IterRecord {
	if e.cfg.IterLog == nil {
		return nil
	}
	dp := e.cfg.Rank
	rec := &IterRecord{V: 1, Rank: e.cfg.Rank, DPRank: &dp, Iter: e.iter, TSUnixMS: start.UnixMilli(),
		CanQueue: canQueue, ADPDummy: e.dummy != nil, NumCtxRequests: len(out.Context),
		CtxRequestIDs: []uint64{}, CtxKVStart: []int{}, CtxChunkTokens: []int{},
		NumPaused: len(out.Paused), NumRecomputePaused: len(out.RecomputePaused), NumSatOut: len(out.SatOut),
		NumDeferred: len(out.Deferred), NumDemoted: len(out.Demoted), StallCount: out.StallCount}
	for _, r := range out.Context {
		rec.CtxRequestIDs = append(rec.CtxRequestIDs, r.ID)
		rec.CtxKVStart = append(rec.CtxKVStart, r.ContextPosition)
		rec.CtxChunkTokens = append(rec.CtxChunkTokens, r.ChunkSize)
		rec.CtxTokens += r.ChunkSize
		rec.CtxCachedKVTokens += r.ContextPosition
		rec.CostS += float64(r.ChunkSize) * (float64(r.ContextPosition) + float64(r.ChunkSize)/2)
	}
	for _, r := range out.Generation {
		if !r.IsDummy {
			rec.NumGenRequests++
			rec.GenTokens++
			rec.GenKVTokens += r.PromptLen + r.Generated
		}
	}
	if m := e.cfg.Scheduler.MaxNumTokens; m != scheduler.Unlimited {
		rec.MaxNumTokens = &m
	}
	if out.CostBudget > 0 {
		ec := e.cfg.Scheduler.EqualCost
		rec.Cost = &costInfo{Offset: ec.KVOffset, Threshold: ec.KVDepthThreshold, R: ec.PerChunkDepthTokens,
			Budget: out.CostBudget, Used: out.CostUsed}
		if e.calib != nil && e.calib.current != nil {
			rec.Cost.Offset, rec.Cost.Threshold = e.calib.current.Offset, e.calib.current.Threshold
		}
	}
	if e.calib != nil && e.calib.fresh {
		p := e.calib.current
		rec.CostPublication = &costPublication{Offset: p.Offset, Threshold: p.Threshold, Budget: p.Budget,
			A: p.A, C2: p.C2, Observations: p.Observations}
	}
	return rec
}

// writeIterRecord completes and writes the record at the end of the iteration.
// p is the record's own iteration, nil when the record was already timed.
func (e *Executor) writeIterRecord(rec *IterRecord, p *plan) error {
	if rec == nil {
		return nil
	}
	e.timeIterRecord(rec, p)
	if e.virtual != nil {
		// Modelled times: how long this rank's device waited for the
		// slowest rank (the lockstep wait); host_ms stays the measured
		// CPU time (the virtual clock's host share is the profile's
		// constant unless MeasuredHostTime). With coupled
		// forwards (MoE) the wait is inside the forward: device_ms is the
		// fleet's step time on every rank, as a GPU would measure it (the
		// offline calibration's T(it) reads it so, router-and-calibration.md
		// §8.2); the rank's own busy time still feeds the lockstep waste.
		rec.WaitMS = 0
		if rec.DeviceMS != nil {
			f := round3(rec.fleetMS)
			rec.FleetDeviceMS = &f
			if e.virtual.CoupledForward() {
				rec.DeviceMS = &f
			} else {
				rec.WaitMS = round3(max(0, rec.fleetMS-*rec.DeviceMS))
			}
		}
	} else if rec.DeviceMS != nil {
		f := round3(max(*rec.DeviceMS, e.fleetBusyMS))
		rec.FleetDeviceMS = &f
	}
	if rec.DeviceMS != nil && e.adp() && e.fleetTokBal >= 0 {
		t := round3(e.fleetTokBal)
		rec.TokenBalance = &t
	}
	rec.KVUtil = round3(e.d.KV.Utilization())
	rec.EventsDropped = int(e.res.EventsDropped)
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("iteration log: %w", err)
	}
	if _, err := e.cfg.IterLog.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("iteration log: %w", err)
	}
	return nil
}

// timeIterRecord measures host_ms and wait_ms of rec's own iteration, once:
// the overlap loop calls it at the end of the iteration that launched the
// batch and writes the record one iteration later.
func (e *Executor) timeIterRecord(rec *IterRecord, p *plan) {
	if rec == nil || rec.timed || p == nil {
		return
	}
	rec.IterMS = round3(float64(e.wall().Sub(p.wallStart)) / 1e6)
	rec.HostMS = round3(float64(e.hostCPU(p)) / 1e6)
	rec.WaitMS = round3(float64(e.waitDur) / 1e6)
	rec.timed = true
}

// statsOf is this iteration's statistics, piggybacked on the next rank state (§13.3).
func (e *Executor) statsOf(out *scheduler.Output) RankState {
	s := RankState{HasStats: true, StatsIter: e.iter,
		PausedAndRecomp: int64(len(out.Paused) + len(out.RecomputePaused))}
	var cost float64
	for _, r := range out.Context {
		s.CtxRequests++
		s.CtxTokens += int64(r.ChunkSize)
		cost += float64(r.ChunkSize) * (float64(r.ContextPosition) + float64(r.ChunkSize)/2)
	}
	s.CostS = int64(cost)
	for _, r := range out.Generation {
		if !r.IsDummy {
			s.GenRequests++
			s.GenTokens++
		}
	}
	return s
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }
