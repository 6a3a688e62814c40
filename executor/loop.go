package executor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// Result is what a rank's loop returns when every rank has drained.
type Result struct {
	// Responses holds every finished or rejected request (rank 0 only).
	Responses []Response
	// Iterations is iter_counter at exit (idle iterations included).
	Iterations int64
	// ForwardIterations counts iterations in which the fleet ran a forward.
	ForwardIterations int64
	// LockstepWaste (rank 0): per forward iteration 1 − mean/max of the
	// ranks' busy time, averaged over iterations where any rank was busy.
	LockstepWaste float64
	// DeviceMS is this rank's total engine time, and MoEWaitMS the part of
	// it spent in MoE exchanges.
	DeviceMS  float64
	MoEWaitMS float64
	// FleetDeviceMS and FleetMoEWaitMS are the sums of every rank's
	// DeviceMS and MoEWaitMS (gathered once at exit under attention DP;
	// this rank's own otherwise).
	FleetDeviceMS, FleetMoEWaitMS float64
	// VirtualDeviceMS is the fleet's total modelled step time (virtual
	// clock only); VirtualEnd is the virtual clock when the loop ended.
	VirtualDeviceMS float64
	VirtualEnd      time.Time
	// Busy (rank 0, Config.RecordBusy, attention DP): every forward
	// iteration's busy time of each rank in ms, rank order — the input of
	// the lockstep-waste distribution and timeline.
	Busy [][]float32
	// CostPublications are the online calibrator's publications, in order
	// (ctx_cost.mode auto).
	CostPublications []costfit.Publication
	// CollectiveMS is this rank's total time blocked in control-plane
	// collectives (C1–C5, C7–C9).
	CollectiveMS float64
	// EventsDropped counts KV events cut from the published stream (rank 0).
	EventsDropped int64
	// Prefix sums every rank's prefix-reuse counters (rank 0 under
	// attention DP; this rank's own otherwise), and LiveBlocks the blocks
	// left in the ranks' radix trees at the end.
	Prefix     kvpool.PrefixStats
	LiveBlocks int64
}

// Executor is one rank's loop state. It is driven by one goroutine.
type Executor struct {
	cfg Config
	d   Deps
	adm Admission // arrival validation, from cfg and the KV pool

	active    []*request
	byID      map[uint64]*request
	sched     []*scheduler.Request // view of active handed to the planner
	iter      int64
	nextDummy uint64
	dummy     *request // pendingDummy (§4.2)
	shutdown  bool

	waiting      []Arrival // received, not routed yet (identical on every rank)
	eventBuf     []byte
	flushes      int // event flushes (tests)
	routerStates []router.RankState
	routerItems  []router.Item

	pending  []Response // rejections, flushed at C8
	finished []Response // completions of this iteration's forward, gathered at C7

	step      bridge.StepDesc
	stepRes   bridge.StepResult
	prev      *batch   // overlap loop: launched, results not applied yet
	spare     *batch   // recycled batch object
	executing []uint64 // ids of prev, handed to the scheduler

	res Result
	// wallClock is the wall clock (Config.Clock before a virtual clock replaces
	// it): collective waits and host time are always measured with it.
	wallClock func() time.Time
	// virtual is the engine's cost model when the clock is virtual
	// (Config.VirtualClock); vnow is then this rank's virtual time.
	virtual StepCoster
	vnow    time.Time
	// calib is the online context-cost calibrator (Config.CostCalibration).
	calib    *calibrator
	wasteSum float64
	wasteN   int
	// Serving (serving.go): this rank's cumulative preemptions, the tokens
	// produced since the last response gather (Config.Stream), answers
	// handed over on rank 0, and this iteration's per-rank busy time and
	// loads (rank 0, Config.OnIteration).
	suspends, recomputes int64
	deltas               []TokenDelta
	answered             int
	iterBusy             []float64
	iterLoads            []RankLoad
	waitDur              time.Duration
	lastStats            RankState
}

// New builds a rank's executor.
func New(cfg Config, d Deps) (*Executor, error) {
	if err := cfg.validate(d); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	var coster StepCoster
	if cfg.VirtualClock {
		var ok bool
		if coster, ok = d.Engine.(StepCoster); !ok {
			return nil, fmt.Errorf("executor: a virtual clock needs an engine that models its step time (the twin), got %T", d.Engine)
		}
	}
	if cfg.MaxIdleSleep <= 0 {
		cfg.MaxIdleSleep = 20 * time.Millisecond
	}
	adm := Admission{Pages: d.KV.TotalPages(), LedgerBlockTokens: d.KV.LedgerBlockTokens(), MaxSeqLen: max(0, cfg.MaxSeqLen),
		Scheduler: cfg.Scheduler}
	if cfg.MaxActivePerRank <= 0 {
		cfg.MaxActivePerRank = 1024
	}
	if cfg.Router == nil {
		r, err := router.New("default", router.Config{MaxActivePerRank: cfg.MaxActivePerRank})
		if err != nil {
			return nil, err
		}
		cfg.Router = r
	}
	e := &Executor{cfg: cfg, d: d, adm: adm, byID: map[uint64]*request{}, nextDummy: dummyIDBase,
		lastStats: RankState{StatsIter: -1}, wallClock: cfg.Clock}
	if coster != nil {
		e.virtual, e.vnow = coster, cfg.VirtualEpoch
		e.cfg.Clock = func() time.Time { return e.vnow }
	}
	if cfg.CostCalibration != nil {
		if cfg.Scheduler.CostMode != scheduler.CostAuto {
			return nil, fmt.Errorf("executor: the online cost calibrator needs ctx_cost.mode auto (have %s)", cfg.Scheduler.CostMode)
		}
		var err error
		if e.calib, err = newCalibrator(*cfg.CostCalibration); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// finalStats gathers every rank's prefix-reuse counters to rank 0 once, at
// the exit every rank agreed on (one more attention-DP collective).
func (e *Executor) finalStats() error {
	ps := e.d.KV.PrefixStats()
	mine := []int64{ps.Admissions, ps.PromptTokens, ps.ReusedTokens, int64(e.d.KV.ReusableBlocks()),
		int64(e.res.DeviceMS * 1000), int64(e.res.MoEWaitMS * 1000)}
	if !e.adp() {
		e.res.Prefix = ps
		e.res.LiveBlocks = mine[3]
		e.res.FleetDeviceMS, e.res.FleetMoEWaitMS = e.res.DeviceMS, e.res.MoEWaitMS
		return nil
	}
	sum, err := e.d.Comm.AllReduceInt64("final_stats", nccl.ReduceSum, mine)
	if err != nil {
		return err
	}
	e.res.Prefix = kvpool.PrefixStats{Admissions: sum[0], PromptTokens: sum[1], ReusedTokens: sum[2]}
	e.res.LiveBlocks = sum[3]
	e.res.FleetDeviceMS, e.res.FleetMoEWaitMS = float64(sum[4])/1000, float64(sum[5])/1000
	return nil
}

// ScheduleCheck reports whether the Helix schedule check is on for this rank.
func (e *Executor) ScheduleCheck() bool { return e.cfg.ScheduleCheck }

// SetSource gives rank 0 its request source (and a progress callback);
// call it before Run, e.g. once every rank is built.
func (e *Executor) SetSource(src Source, progress func(done int)) {
	e.d.Source = src
	if progress != nil {
		e.cfg.Progress = progress
	}
}

// Run drives the loop until rank 0's source is exhausted and every rank has
// drained. Every rank returns in the same iteration.
func (e *Executor) Run() (*Result, error) {
	if e.cfg.Rank == 0 && e.d.Source == nil {
		return nil, errors.New("executor: rank 0 needs a request source")
	}
	for {
		more, err := e.iteration()
		if err != nil {
			return nil, fmt.Errorf("rank %d iteration %d: %w", e.cfg.Rank, e.iter, err)
		}
		if !more {
			break
		}
	}
	if err := e.drain(); err != nil {
		return nil, fmt.Errorf("rank %d: draining the last batch: %w", e.cfg.Rank, err)
	}
	if err := e.finalStats(); err != nil {
		return nil, fmt.Errorf("rank %d: final statistics: %w", e.cfg.Rank, err)
	}
	e.res.Iterations = e.iter
	if e.virtual != nil {
		e.res.VirtualEnd = e.vnow
	}
	if e.wasteN > 0 {
		e.res.LockstepWaste = e.wasteSum / float64(e.wasteN)
	}
	return &e.res, nil
}

// wall reads the wall clock (Config.Clock, even when a virtual clock
// replaced it for request timestamps).
func (e *Executor) wall() time.Time {
	if e.wallClock != nil {
		return e.wallClock()
	}
	return e.cfg.Clock()
}

// multi: more than one rank (the world collectives C2/C3 run).
func (e *Executor) multi() bool { return e.cfg.Ranks > 1 }

// adp: attention data parallelism — each rank owns its requests and the tp
// collectives C1, C5, C7, C8 run. Helix CP ranks hold replicas instead.
func (e *Executor) adp() bool { return e.cfg.Ranks > 1 && !e.cfg.Helix }

// plan is the part of an iteration shared by both loops (§5 steps 1–7, §6
// steps 1–8): fetch and route, padding, scheduling, recompute resets and the
// agreement on whether the fleet runs a forward.
type plan struct {
	start            time.Time // the iteration's start on the loop's clock (virtual or wall)
	wallStart        time.Time // the same on the wall clock (host time)
	out              *scheduler.Output
	fleetWork        bool
	canQueue         bool // agreed
	canQueueThisRank bool // local
	rec              *IterRecord
	stats            RankState
	fleetMS          float64 // virtual clock: the launched step's agreed duration
}

// prologue runs the shared part. It returns nil when the loop exits.
func (e *Executor) prologue() (*plan, error) {
	p := &plan{start: e.cfg.Clock(), wallStart: e.wall()}
	e.waitDur = 0
	// A watchdog comm names the iteration in its timeout reports.
	if w, ok := e.d.Comm.(interface{ SetIteration(int64) }); ok {
		w.SetIteration(e.iter)
	}
	// Fetch and route.
	states, err := e.gatherRankStates()
	if err != nil {
		return nil, err
	}
	items, err := e.fetchArrivals(p.start)
	if err != nil {
		return nil, err
	}
	if e.virtual != nil {
		p.start = e.vnow // rank 0's clock, agreed in the arrival broadcast
	}
	// The online calibrator sees the previous iteration's gathered
	// statistics before this pass is planned (§9.2, §10.2).
	if e.calib != nil {
		if err := e.observeCost(states); err != nil {
			return nil, err
		}
	}
	if e.adp() {
		e.route(items, states)
	} else {
		// Without attention DP every rank takes every request (Helix CP
		// ranks hold replicas; every rank receives the same broadcast).
		for _, a := range items {
			e.admit(a, scheduler.UnsetEstimate)
		}
	}
	p.fleetWork = len(items) > 0 || len(e.waiting) > 0
	for _, s := range states {
		p.fleetWork = p.fleetWork || s.ActiveRequests > 0 || s.RetiringRequests > 0
	}
	if !e.adp() {
		p.fleetWork = p.fleetWork || e.hasRealWork() // identical on every CP rank
	}
	if e.shutdown && !p.fleetWork {
		return nil, nil // agreed: every rank saw the same states and broadcast
	}
	// Padding dummy.
	if e.adp() && p.fleetWork {
		e.padDummy()
	}
	// Schedule. Requests of the executing batch are scheduled normally but
	// are never victims.
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
	if p.out, err = e.d.Planner.Schedule(e.sched, e.executing); err != nil {
		return nil, err
	}
	if e.cfg.OnNote != nil {
		for _, n := range p.out.Notes {
			e.cfg.OnNote(e.cfg.Rank, n)
		}
	}
	// The Helix schedule check sits right after scheduling, before the
	// recompute reset and canQueue (§11.1, §11.6).
	if e.cfg.ScheduleCheck {
		t := e.wall()
		err := checkSchedule(e.d.Comm, summarize(e.iter, p.out, e.d.KV.Capacity))
		e.waitDur += e.wall().Sub(t)
		if err != nil {
			return nil, err
		}
	}
	// Recompute victims are reset right after scheduling (§11.1).
	e.handlePaused(p.out)
	// Page copies of this pass (suspend to / resume from the host tier) go
	// to the engine before any later forward.
	if err := e.submitCopies(); err != nil {
		return nil, err
	}
	if p.canQueue, p.canQueueThisRank, err = e.canQueue(p.out.NumFitting); err != nil {
		return nil, err
	}
	p.rec = e.newIterRecord(p.start, p.out, p.canQueue)
	p.stats = e.statsOf(p.out)
	return p, nil
}

// hasRealWork reports whether this rank holds any non-dummy request.
func (e *Executor) hasRealWork() bool {
	for _, r := range e.active {
		if !r.IsDummy {
			return true
		}
	}
	return false
}

// iteration runs one iteration of the configured loop. It returns false when
// the loop exits.
func (e *Executor) iteration() (bool, error) {
	p, err := e.prologue()
	if err != nil || p == nil {
		return false, err
	}
	if e.cfg.Overlap {
		err = e.overlapTail(p)
	} else {
		err = e.nonOverlapTail(p)
	}
	if err != nil {
		return false, err
	}
	e.res.CollectiveMS += float64(e.waitDur) / 1e6
	p.stats.HostUS = e.wall().Sub(p.wallStart).Microseconds()
	if e.virtual != nil {
		// The iteration's time on the virtual clock: what the fleet took.
		p.stats.HostUS = e.vnow.Sub(p.start).Microseconds()
	}
	e.lastStats = p.stats
	if e.cfg.Rank == 0 && e.cfg.Progress != nil {
		e.cfg.Progress(e.answered)
	}
	if e.cfg.Rank == 0 && e.cfg.OnIteration != nil {
		e.reportIteration(p)
	}
	if !p.canQueue && !p.fleetWork {
		e.idleWait()
	}
	e.iter++
	return true, nil
}

// nonOverlapTail is §5 steps 8–12: every collective sits under the agreed
// can_queue or runs unconditionally.
func (e *Executor) nonOverlapTail(p *plan) error {
	var deviceMS float64
	if p.canQueue {
		b, err := e.prepareBatch(p.out, p)
		if err != nil {
			return err
		}
		e.dummy = nil // the dummy runs and leaves after the forward
		if err := e.buildStep(b); err != nil {
			return err
		}
		if err := e.d.Engine.Step(&e.step, &e.stepRes); err != nil {
			return err
		}
		if e.virtual != nil {
			// The step's results exist once the slowest rank finished it.
			fleet, err := e.fleetStepMS(p.rec)
			if err != nil {
				return err
			}
			e.advance(fleet + e.virtual.HostMS())
		}
		e.markLaunched(b)
		if deviceMS, err = e.applyResults(b, &e.stepRes); err != nil {
			return err
		}
		if err := e.gatherResponses("responses", e.finished, 0, false); err != nil {
			return err
		}
		// R6: the non-overlap loop flushes under the agreed can_queue.
		if err := e.addKVCacheEventsSynced(true); err != nil {
			return err
		}
	} else {
		e.revertGeneration(p.out)
		e.rollbackDummy()
		if e.virtual != nil {
			e.advance(e.virtual.HostMS())
		}
	}
	e.finished = e.finished[:0]
	if err := e.gatherResponses("pending_responses", e.pending, int64(deviceMS*1000), p.canQueue); err != nil {
		return err
	}
	e.pending = e.pending[:0]
	return e.writeIterRecord(p.rec, p.wallStart)
}

// overlapTail is §6 steps 8–17: the new batch is launched asynchronously and
// the previous batch's results are applied around it.
func (e *Executor) overlapTail(p *plan) error {
	shouldProcessPrev := p.canQueue || !p.canQueueThisRank
	var b *batch
	var err error
	if p.canQueue {
		if b, err = e.prepareBatch(p.out, p); err != nil {
			return err
		}
		e.dummy = nil
	} else {
		e.revertGeneration(p.out)
		e.rollbackDummy()
	}
	// 11: apply the previous batch's sampled tokens.
	processed := e.prev != nil && shouldProcessPrev
	var deviceMS float64
	if processed {
		var res bridge.StepResult
		if err := e.d.Engine.Wait(&res); err != nil {
			return err
		}
		if deviceMS, err = e.applyResults(e.prev, &res); err != nil {
			return err
		}
	}
	// 12: pending responses, always (with the processed batch's busy time).
	if err := e.gatherResponses("pending_responses", e.pending, int64(deviceMS*1000), processed); err != nil {
		return err
	}
	e.pending = e.pending[:0]
	// 13–14: launch, then the state updates of the launch.
	if p.canQueue {
		if err := e.buildStep(b); err != nil {
			return err
		}
		if err := e.d.Engine.Submit(&e.step); err != nil {
			return err
		}
		if e.virtual != nil {
			if p.fleetMS, err = e.fleetStepMS(p.rec); err != nil {
				return err
			}
		}
		e.markLaunched(b)
	}
	// 15: exactly one response gather in either branch.
	if processed {
		if err := e.gatherResponses("responses", e.finished, 0, false); err != nil {
			return err
		}
		if err := e.writeIterRecord(e.prev.rec, e.prev.start); err != nil {
			return err
		}
	} else if err := e.gatherResponses("responses", nil, 0, false); err != nil {
		return err
	}
	e.finished = e.finished[:0]
	// 16: exactly once per iteration, right after the previous-batch branch.
	if err := e.addKVCacheEventsSynced(processed); err != nil {
		return err
	}
	if !p.canQueue {
		// An iteration without a forward logs at its own end (§13.1).
		if err := e.writeIterRecord(p.rec, p.wallStart); err != nil {
			return err
		}
	}
	// The host schedules the next iteration while the device runs this
	// one: the iteration lasts the longer of the two.
	if e.virtual != nil {
		e.advance(max(p.fleetMS, e.virtual.HostMS()))
	}
	// 17.
	switch {
	case p.canQueue:
		e.timeIterRecord(p.rec, p.wallStart)
		e.prev = b
	case processed:
		e.prev = nil
	}
	return nil
}

// drain applies a batch still in flight when the loop exits (only dummies
// can remain: real requests keep the fleet busy until processed).
func (e *Executor) drain() error {
	if e.prev == nil {
		return nil
	}
	var res bridge.StepResult
	if err := e.d.Engine.Wait(&res); err != nil {
		return err
	}
	_, err := e.applyResults(e.prev, &res)
	e.prev = nil
	return err
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

// gatherRankStates is C1: every rank's state, indexed by its rank field.
func (e *Executor) gatherRankStates() ([]RankState, error) {
	mine := e.rankState()
	if !e.adp() {
		return []RankState{mine}, nil
	}
	t := e.wall()
	v, err := e.allGatherDecoded("rank_state", mine.encode(), e.decodeRankStates)
	e.waitDur += e.wall().Sub(t)
	if err != nil {
		return nil, err
	}
	return v.([]RankState), nil // shared with the other ranks of a coroutine fleet: read-only
}

// decodeRankStates decodes the gathered rank states, indexed by their rank
// field. It reads only its argument (and the configured rank count), so a
// coroutine fleet runs it once for every rank.
func (e *Executor) decodeRankStates(all [][]byte) (any, error) {
	states := make([]RankState, e.cfg.Ranks)
	for i, b := range all {
		s, err := decodeRankState(b)
		if err != nil {
			return nil, err
		}
		if s.Rank < 0 || int(s.Rank) >= e.cfg.Ranks {
			return nil, fmt.Errorf("collective desync: rank state from member %d names rank %d", i, s.Rank)
		}
		states[s.Rank] = s
	}
	return states, nil
}

// allGatherDecoded is an allgather followed by decode. On a communicator
// that shares results between in-process members (nccl.SharedGatherer),
// decode runs once for the whole fleet and the result is shared, so decode
// must depend on its argument only and its result must be read-only.
func (e *Executor) allGatherDecoded(name string, data []byte, decode func([][]byte) (any, error)) (any, error) {
	if sg, ok := e.d.Comm.(nccl.SharedGatherer); ok {
		return sg.AllGatherDecoded(name, data, decode)
	}
	all, err := e.d.Comm.AllGather(name, data)
	if err != nil {
		return nil, err
	}
	return decode(all)
}

func (e *Executor) rankState() RankState {
	s := e.lastStats
	s.Rank = int64(e.cfg.Rank)
	s.ActiveRequests, s.ActiveTokens, s.RetiringRequests = 0, 0, 0
	for _, r := range e.active {
		if r.IsDummy {
			continue
		}
		if r.State == scheduler.GenerationToComplete {
			s.RetiringRequests++
			continue
		}
		s.ActiveRequests++
		s.ActiveTokens += int64(len(r.prompt))
	}
	return s
}

// fetchArrivals is C2/C3: rank 0 broadcasts the count (and the shutdown
// flag), then the items only if the count is non-zero.
func (e *Executor) fetchArrivals(now time.Time) ([]Arrival, error) {
	var items []Arrival
	var cancels []uint64
	var shut bool
	if e.cfg.Rank == 0 {
		items = e.screenArrivals(e.d.Source.Due(now), now)
		if c, ok := e.d.Source.(Canceller); ok {
			cancels = c.Cancelled()
		}
		// Rejections made here are gathered at this iteration's C8; hold the
		// shutdown back one iteration so that the loop cannot exit first
		// (they are not fleet work: the other ranks never see them).
		shut = e.d.Source.Exhausted() && len(e.pending) == 0
	}
	if !e.multi() {
		e.shutdown = e.shutdown || shut
		e.cancelRequests(cancels)
		return items, nil
	}
	// Header: arrivals, shutdown, cancellations, [rank 0's virtual clock].
	hdrLen := 24
	if e.virtual != nil {
		hdrLen = 32 // + rank 0's virtual clock (configuration-dependent, identical on every rank)
	}
	hdr := make([]byte, hdrLen)
	binary.LittleEndian.PutUint64(hdr, uint64(len(items)))
	if shut {
		binary.LittleEndian.PutUint64(hdr[8:], 1)
	}
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(cancels)))
	if e.virtual != nil {
		binary.LittleEndian.PutUint64(hdr[24:], uint64(e.vnow.UnixNano()))
	}
	t := e.wall()
	defer func() { e.waitDur += e.wall().Sub(t) }()
	got, err := e.d.Comm.Broadcast("arrival_count", 0, hdr)
	if err != nil {
		return nil, err
	}
	if len(got) != hdrLen {
		return nil, fmt.Errorf("collective desync: arrival count of %d bytes", len(got))
	}
	if e.virtual != nil {
		e.vnow = time.Unix(0, int64(binary.LittleEndian.Uint64(got[24:])))
	}
	count := int(binary.LittleEndian.Uint64(got))
	e.shutdown = e.shutdown || binary.LittleEndian.Uint64(got[8:]) != 0
	if nc := binary.LittleEndian.Uint64(got[16:]); nc > 0 {
		// Every rank withdraws them here, before this iteration schedules.
		if nc > 1<<20 {
			return nil, fmt.Errorf("collective desync: %d cancellations announced", nc)
		}
		raw, err := e.d.Comm.Broadcast("cancellations", 0, encodeIDs(cancels))
		if err != nil {
			return nil, err
		}
		ids, err := decodeIDs(raw, int(nc))
		if err != nil {
			return nil, err
		}
		e.cancelRequests(ids)
	}
	if count == 0 {
		return nil, nil
	}
	var payload []byte
	if e.cfg.Rank == 0 {
		payload = encodeArrivals(items)
	}
	if payload, err = e.d.Comm.Broadcast("arrivals", 0, payload); err != nil {
		return nil, err
	}
	if e.cfg.Rank == 0 {
		return items, nil
	}
	return decodeArrivals(payload, count)
}

// screenArrivals is rank 0's length check before the broadcast: an arrival
// that can never be served anywhere (Admission: every rank has the same
// pool and rules) gets its rejection in pendingResponses, with Rank NoRank,
// and is neither synthesised nor broadcast nor routed; a lazy prompt of the
// others is synthesised now. This extends executor.md §3 step 4, which the
// owning rank still runs after routing, so that a trace request of
// billions of tokens costs nothing and a length that does not fit the
// 32-bit wire format never reaches it.
func (e *Executor) screenArrivals(items []Arrival, now time.Time) []Arrival {
	if len(items) == 0 {
		return nil
	}
	kept := make([]Arrival, 0, len(items)) // the source may keep its slice: never write to it
	for _, a := range items {
		reason := e.adm.NeverFits(a.promptLen(), a.MaxNewTokens)
		if err := a.Sampling.Validate(); reason == "" && err != nil {
			reason = "invalid sampling parameters: " + err.Error()
		}
		if reason != "" {
			e.pending = append(e.pending, Response{ID: a.ID, Rank: NoRank, ArrivalUnixNS: a.ArrivalUnixNS,
				FinishUnixNS: max(now.UnixNano(), a.ArrivalUnixNS), Error: reason})
			continue
		}
		if a.Prompt == nil && a.Synthesize != nil {
			a.Prompt = a.Synthesize()
			if len(a.Prompt) != a.PromptLen {
				panic(fmt.Sprintf("executor: arrival %d synthesised %d tokens, PromptLen says %d", a.ID, len(a.Prompt), a.PromptLen))
			}
		}
		a.Synthesize = nil
		kept = append(kept, a)
	}
	return kept
}

// route appends the arrivals to the waiting queue, pops what the ranks can
// take and routes it with the deterministic router (router-and-calibration.md
// §1): every rank runs the same calls on the same agreed inputs (the gathered
// states, the broadcast items) and keeps its own assignments, with the
// router's uncached-prefill estimate.
func (e *Executor) route(items []Arrival, states []RankState) {
	e.waiting = append(e.waiting, items...)
	if len(e.waiting) == 0 {
		return
	}
	rs := e.routerStates[:0]
	for _, s := range states {
		rs = append(rs, router.RankState{Rank: int(s.Rank), ActiveRequests: int(s.ActiveRequests),
			ActiveTokens: s.ActiveTokens, RetiringRequests: int(s.RetiringRequests)})
	}
	e.routerStates = rs
	items2 := e.routerItems[:0]
	for i := range e.waiting {
		a := &e.waiting[i]
		items2 = append(items2, router.Item{ID: uint64(i), PromptLen: a.promptLen(), ConversationID: a.ConversationID,
			AffinityID: a.Routing.AffinityID, HasTarget: a.Routing.HasRank, Target: a.Routing.Rank, Strict: a.Routing.Strict})
	}
	e.routerItems = items2
	taken, remaining := router.PopWaiting(items2, rs, e.cfg.MaxActivePerRank)
	res := e.cfg.Router.Route(taken, rs)
	for _, i := range res.Order {
		a := e.waiting[taken[i].ID]
		if res.Ranks[i] == e.cfg.Rank {
			e.admit(a, res.Estimate(i))
		}
	}
	// Keep the put-backs (in order) and the unexamined items.
	next := make([]Arrival, 0, len(remaining))
	for _, it := range remaining {
		next = append(next, e.waiting[it.ID])
	}
	e.waiting = next
}

// admit validates an arrival (§3.4); a request that can never run is
// rejected at once with the reason and never enters active.
func (e *Executor) admit(a Arrival, estimate int64) {
	if a.Prompt == nil && a.Synthesize != nil {
		a.Prompt = a.Synthesize()
	}
	r := newRequest(a)
	r.UncachedEstimate = estimate
	if e.cfg.Helix {
		r.TotalInputLenCP = r.PromptLen
		e.setHelixLocalLen(r)
	}
	if reason := e.neverFits(r); reason != "" {
		e.pending = append(e.pending, Response{ID: a.ID, Rank: e.cfg.Rank, ArrivalUnixNS: a.ArrivalUnixNS,
			FinishUnixNS: e.cfg.Clock().UnixNano(), Error: reason})
		return
	}
	e.active = append(e.active, r)
	e.byID[r.ID] = r
}

// neverFits is arrival validation on the owning rank (executor.md §3 step 4).
func (e *Executor) neverFits(r *request) string {
	return e.adm.NeverFits(r.PromptLen, r.MaxNewTokens)
}

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
	d := newDummy(e.nextDummy)
	if !e.d.KV.AddDummy(&d.Request, 1) {
		return
	}
	e.nextDummy++
	e.active = append(e.active, d)
	e.byID[d.ID] = d
	e.dummy = d
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

// canQueue is C5 (§4.3): the fleet runs a forward only if every rank has a batch.
func (e *Executor) canQueue(b int) (canQueue, thisRank bool, err error) {
	if !e.adp() {
		return b > 0, b > 0, nil
	}
	v := make([]byte, 8)
	binary.LittleEndian.PutUint64(v, uint64(b))
	t := e.wall()
	all, err := e.d.Comm.AllGather("batch_size", v)
	e.waitDur += e.wall().Sub(t)
	if err != nil {
		return false, false, err
	}
	ok := true
	for i, x := range all {
		if len(x) != 8 {
			return false, false, fmt.Errorf("collective desync: batch size from rank %d has %d bytes", i, len(x))
		}
		ok = ok && binary.LittleEndian.Uint64(x) > 0
	}
	return ok, b > 0, nil
}

// gatherResponses sends this rank's responses to rank 0 (C7/C8). Rank 0
// keeps them; with C8 it also accumulates the lockstep-waste metric.
func (e *Executor) gatherResponses(name string, rs []Response, deviceUS int64, forward bool) error {
	// The produced tokens ride the "responses" gather (after the step's
	// results were applied), the loads the "pending_responses" one.
	var deltas []TokenDelta
	if name == "responses" {
		deltas, e.deltas = e.deltas, e.deltas[:0]
	}
	var load RankLoad
	if name == "pending_responses" && e.cfg.OnIteration != nil {
		load = e.load()
	}
	if !e.adp() {
		// Without attention DP only rank 0 answers; the others hold replicas.
		if e.cfg.Rank == 0 {
			e.deliver(deltas, rs)
			if name == "pending_responses" {
				e.iterLoads = append(e.iterLoads[:0], load)
				e.iterBusy = e.iterBusy[:0]
				if forward {
					e.iterBusy = append(e.iterBusy, float64(deviceUS)/1000)
				}
			}
		}
		return nil
	}
	t := e.wall()
	all, err := e.d.Comm.AllGather(name, responseBatch{DeviceUS: deviceUS, Responses: rs, Deltas: deltas, Load: load}.encode())
	e.waitDur += e.wall().Sub(t)
	if err != nil {
		return err
	}
	if e.cfg.Rank != 0 {
		return nil
	}
	var sum, max float64
	record := e.cfg.RecordBusy && name == "pending_responses" && forward
	var busy []float32
	if record {
		busy = make([]float32, len(all))
	}
	if name == "pending_responses" {
		e.iterLoads, e.iterBusy = e.iterLoads[:0], e.iterBusy[:0]
	}
	for i, b := range all {
		rb, err := decodeResponseBatch(b)
		if err != nil {
			return err
		}
		e.deliver(rb.Deltas, rb.Responses)
		us := float64(rb.DeviceUS)
		sum += us
		if us > max {
			max = us
		}
		if record {
			busy[i] = float32(us / 1000)
		}
		if name == "pending_responses" {
			e.iterLoads = append(e.iterLoads, rb.Load)
			if forward {
				e.iterBusy = append(e.iterBusy, us/1000)
			}
		}
	}
	if record {
		e.res.Busy = append(e.res.Busy, busy)
	}
	if name == "pending_responses" && forward && max > 0 {
		e.wasteSum += 1 - sum/float64(len(all))/max
		e.wasteN++
	}
	return nil
}

// deliver hands rank 0's gathered tokens and answers over: to the serving
// callbacks, and to Result unless Config.DiscardResponses.
func (e *Executor) deliver(deltas []TokenDelta, rs []Response) {
	if len(deltas) > 0 && e.cfg.OnTokens != nil {
		e.cfg.OnTokens(deltas)
	}
	e.answered += len(rs)
	if !e.cfg.DiscardResponses {
		e.res.Responses = append(e.res.Responses, rs...)
	}
	if e.cfg.OnResponse != nil {
		for _, r := range rs {
			e.cfg.OnResponse(r)
		}
	}
}

// reportIteration hands the iteration's fleet state to Config.OnIteration.
func (e *Executor) reportIteration(p *plan) {
	st := FleetStats{Iter: e.iter, Forward: len(e.iterBusy) > 0, Ranks: append([]RankLoad(nil), e.iterLoads...),
		IterationMS: float64(e.wall().Sub(p.wallStart).Microseconds()) / 1000, CostPublications: len(e.res.CostPublications)}
	if st.Forward {
		st.BusyMS = append([]float64(nil), e.iterBusy...)
		var sum, max float64
		for _, b := range st.BusyMS {
			sum += b
			max = math.Max(max, b)
		}
		if max > 0 {
			st.LockstepWaste = 1 - sum/float64(len(st.BusyMS))/max
		}
	}
	e.cfg.OnIteration(st)
}

// idleWait paces an idle fleet: rank 0 sleeps until the next arrival (the
// others wait for it in the next iteration's collectives).
func (e *Executor) idleWait() {
	if e.cfg.Rank != 0 || e.d.Source.Exhausted() {
		return
	}
	if e.virtual != nil {
		// Virtual time jumps to the next arrival; the other ranks take
		// rank 0's clock from the next arrival broadcast.
		if next := e.d.Source.NextArrival(); next.After(e.vnow) {
			e.vnow = next
		}
		return
	}
	d := e.d.Source.NextArrival().Sub(e.cfg.Clock())
	if d > e.cfg.MaxIdleSleep {
		d = e.cfg.MaxIdleSleep
	}
	if d > 0 {
		time.Sleep(d)
	}
}

// remove drops r from active, keeping the order of the others.
func (e *Executor) remove(r *request) {
	for i, x := range e.active {
		if x == r {
			copy(e.active[i:], e.active[i+1:])
			e.active[len(e.active)-1] = nil
			e.active = e.active[:len(e.active)-1]
			break
		}
	}
	delete(e.byID, r.ID)
}
