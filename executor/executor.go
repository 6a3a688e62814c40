package executor

import (
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// An Executor is one rank's loop state: what it owns (the active requests,
// the waiting queue, the launched batch), what it reports (Result), and the
// helpers every stage uses (clocks, group predicates, shared gathers).

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
	// ADPBalanceHeld counts the iterations in which ADP Balance held back
	// the contexts some rank had scheduled (Config.ADPBalance).
	ADPBalanceHeld int64
	// CostLeveled counts the passes in which cost leveling deferred or cut
	// some rank's first chunks (Config.ADPBalance.CostLeveling);
	// CostLevelCut the first chunks this rank cut to the room it had.
	CostLeveled, CostLevelCut int64
	// TokenBalance (rank 0, attention DP): per forward iteration mean/max
	// over the ranks of the real tokens in their batch (padding dummies
	// count 0), averaged over the iterations where some rank had a token;
	// 0 when none did. BalanceIterations counts those iterations.
	TokenBalance      float64
	BalanceIterations int64
	// ForwardMS is Σ over forward iterations of the fleet's time (the
	// slowest rank's busy time) and SOLForwardMS Σ of it × the iteration's
	// token balance: the time a perfectly balanced fleet would have needed
	// (the speed of light of ADP Balance's write-up; rank 0, attention DP).
	ForwardMS, SOLForwardMS float64
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
	// Tokens (beside Busy) is every forward iteration's real tokens of each
	// rank (padding dummies count 0), rank order: the token balance over
	// iterations.
	Tokens [][]int32
	// CostPublications are the online calibrator's publications, in order
	// (ctx_cost.mode auto).
	CostPublications []costfit.Publication
	// CostLastRefit is the online calibrator's last refit, "" if it never
	// refitted: why it did not publish (ctx_cost.mode auto).
	CostLastRefit string
	// CollectiveMS is this rank's total time blocked in control-plane
	// collectives (C1–C5, C7–C9); 0 under a virtual clock without an
	// iteration log, a serving callback or the measured host time.
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
	adm scheduler.Admission // arrival validation, from cfg and the KV pool
	// cutNoted: the warning that an arrival's max_new_tokens was cut to
	// max_seq_len went out (once a run).
	cutNoted bool

	active []*request
	byID   map[uint64]*request
	// idCache holds indexed requests only, by id (request; a direct-mapped
	// cache in front of byID).
	idCache   [idCacheSize]*request
	sched     []*scheduler.Request // view of active handed to the planner
	iter      int64
	nextDummy uint64
	dummy     *request // pendingDummy (§4.2)
	shutdown  bool

	waiting waitQueue // received, not routed yet (identical on every rank)
	routed  int       // requests the last route call took from it (identical on every rank)
	// cancelledBuf holds the arrivals cancelQueued took out of the queue;
	// queueCancels counts them in this iteration (identical on every rank).
	cancelledBuf []Arrival
	queueCancels int
	popper       router.Popper
	putBack      []Arrival // scratch of route: the put-backs of one pop
	eventBuf     []byte
	// wire is the scratch buffer this rank's collective payloads are
	// encoded into (a Comm does not keep the data it is given).
	wire         []byte
	flushes      int // event flushes (tests)
	routerStates []router.RankState

	pending  []Response // rejections, flushed at C8
	finished []Response // completions of this iteration's forward, gathered at C7
	// pendingWire is the C8 payload encoded at step 12 of the overlap loop
	// under attention DP, gathered with C7 (foldPending); pendingFolded
	// says it waits for it, pendingForward whether it timed a forward.
	// pendSplit and respSplit are rank 0's split of that gather.
	pendingWire          []byte
	pendingFolded        bool
	pendingForward       bool
	pendSplit, respSplit [][]byte

	step    bridge.StepDesc
	stepRes bridge.StepResult
	waitRes bridge.StepResult // overlap loop: the previous batch's results
	planBuf plan              // the iteration's plan (prologue)
	// costPlan is the launched plan whose step cost rides this iteration's
	// response gather (overlap loop under attention DP with a virtual
	// clock, virtual.go); costSplit is that gather's decode scratch.
	costPlan  *plan
	costSplit [][]byte
	// intakeBuf is rank 0's intake encoded for its rank state (C1 with
	// C2/C3 folded in, gatherStatesAndArrivals).
	intakeBuf []byte
	// The decoders of C1 and of C7 with a step cost, and their results,
	// two of each used in turn: a decoded gather is read only until the
	// next gather of its kind (a coroutine fleet shares rank 0's C7 result
	// and puts C1's in slots).
	decodeStates, splitCosts, joinCosts func([][]byte) (any, error)
	statesBuf                           [2]gatheredStates
	costedBuf                           [2]costedGather
	statesTurn, costedTurn              int
	// slots is a coroutine fleet's shared C1 result (fleetSlots), nil
	// elsewhere; slotTurn picks this member's half of it for its next C1.
	slots    *fleetSlots
	slotTurn int
	slotCost slotCoster   // the virtual engine, when it costs from slots
	ownState [1]RankState // the gathered states without attention DP
	// stateLen is the number of values of this fleet's rank states:
	// RankStateLen, or rankStateLenPrefill when the router reads the
	// ranks' pending prefill (least_prefill placement).
	stateLen int
	prev     *batch // overlap loop: launched, results not applied yet
	spare    *batch // recycled batch object
	// spareDummies are padding dummies that ran and left, whose storage
	// the next dummies reuse (takeDummy).
	spareDummies []*request
	executing    []uint64 // ids of prev, handed to the scheduler

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
	bal      balance
	// adpWait and adpBatch are ADP Balance's counters (adpbalance.go):
	// iterations contexts were held waiting for every rank to have one,
	// and for batch equilibration. Equal on every rank.
	adpWait, adpBatch int
	// levelWait counts the passes in a row cost leveling deferred a first
	// chunk (leveling.go). Equal on every rank.
	levelWait int
	// Serving (serving.go): this rank's cumulative preemptions, the tokens
	// produced since the last response gather (Config.Stream), answers
	// handed over on rank 0, and this iteration's per-rank busy time and
	// loads (rank 0, Config.OnIteration).
	suspends, recomputes int64
	deltas               []TokenDelta
	answered             int
	iterBusy             []float64
	iterTokens           []int64 // each rank's real tokens of the batch iterBusy timed
	fleetBusyMS          float64 // the slowest rank's busy time of the last processed batch (iteration log)
	fleetTokBal          float64 // its token balance (mean/max of the ranks' tokens); -1 when none
	iterLoads            []RankLoad
	waitDur              time.Duration
	waitCPU              time.Duration // thread CPU inside this iteration's collectives (waitEnd)
	cpuClock             bool          // the loop thread is locked and has a CPU clock (host_ms, MeasuredHostTime)
	// engineCPU is the engine's native CPU clock when its calls run on the
	// loop thread (Config.EngineThread): left out of host_ms. nil otherwise.
	engineCPU      bridge.NativeCPUReporter
	engineCPUStart time.Duration // engineCPU at the iteration's start
	lastYield      time.Time     // the last yieldIfDue that yielded
	timed          bool          // something reads the wall clock's measurements (wall)
	lastStats      RankState
	// Optional capabilities of the dependencies, resolved once in New
	// (resolveCapabilities; the source's in SetSource too): the planner's
	// PublishCost (ctx_cost.mode auto), the comm's watchdog iteration and
	// shared decoding, the source's cancellations. nil when absent.
	costPub    CostPublisher
	iterComm   iterationNamer
	sharedComm nccl.SharedGatherer
	idleComm   nccl.IdleWaiter // an MPI comm: the idle doorbell (idleDoorbell)
	idleRun    int             // idle iterations in a row (agreed)
	canceller  Canceller
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
	adm := scheduler.Admission{Pages: d.KV.TotalPages(), LedgerBlockTokens: d.KV.LedgerBlockTokens(), MaxSeqLen: max(0, cfg.MaxSeqLen),
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
	e.decodeStates, e.splitCosts, e.joinCosts = e.decodeRankStates, e.splitStepCosts, e.joinStepCosts // made once: no closure per gather
	e.stateLen = RankStateLen
	if router.ReadsPendingPrefill(cfg.Router) {
		e.stateLen = rankStateLenPrefill
	}
	if coster != nil {
		e.virtual, e.vnow = coster, cfg.VirtualEpoch
		e.cfg.Clock = func() time.Time { return e.vnow }
	}
	// Under a virtual clock the wall clock serves only the iteration log,
	// the serving callback and the measured host time; without them it is
	// not read (two readings per collective: a tenth of a 64-rank twin run's
	// CPU), and wait_ms/CollectiveMS stay 0.
	e.timed = e.virtual == nil || e.cfg.IterLog != nil || e.cfg.OnIteration != nil || e.measuredHost()
	if cfg.CostCalibration != nil {
		if cfg.Scheduler.CostMode != scheduler.CostAuto {
			return nil, fmt.Errorf("executor: the online cost calibrator needs ctx_cost.mode auto (have %s)", cfg.Scheduler.CostMode)
		}
		var err error
		if e.calib, err = newCalibrator(*cfg.CostCalibration); err != nil {
			return nil, err
		}
	}
	if err := e.resolveCapabilities(); err != nil {
		return nil, err
	}
	return e, nil
}

// iterationNamer is a communicator whose watchdog names the iteration in
// its timeout reports (nccl's watchdog comm).
type iterationNamer interface{ SetIteration(int64) }

// resolveCapabilities asserts the optional interfaces of the dependencies
// once, here, and keeps what it found: no iteration asserts on them. A
// capability that the configuration needs and a dependency lacks is an
// error naming the setting and the dependency's type, before any rank
// enters a collective, not thousands of iterations in (a wrapper planner
// must forward it).
func (e *Executor) resolveCapabilities() error {
	if e.calib != nil {
		p, ok := e.d.Planner.(CostPublisher)
		if !ok {
			return fmt.Errorf("executor: ctx_cost.mode auto needs a planner that takes publications, got %T", e.d.Planner)
		}
		e.costPub = p
	}
	e.iterComm, _ = e.d.Comm.(iterationNamer)
	e.sharedComm, _ = e.d.Comm.(nccl.SharedGatherer)
	if e.virtual == nil && e.cfg.Ranks > 1 && e.cfg.IdlePoll > 0 {
		e.idleComm, _ = e.d.Comm.(nccl.IdleWaiter)
	}
	if e.sharedComm != nil && e.adp() {
		ranks := e.cfg.Ranks
		e.slots = e.sharedComm.Shared("executor.fleetSlots", func() any { return newFleetSlots(ranks) }).(*fleetSlots)
		e.slotCost, _ = e.virtual.(slotCoster)
	}
	e.canceller, _ = e.d.Source.(Canceller)
	return nil
}

// ScheduleCheck reports whether the Helix schedule check is on for this rank.
func (e *Executor) ScheduleCheck() bool { return e.cfg.ScheduleCheck }

// SetSource gives rank 0 its request source (and a progress callback);
// call it before Run, e.g. once every rank is built.
func (e *Executor) SetSource(src Source, progress func(done int)) {
	e.d.Source = src
	e.canceller, _ = src.(Canceller)
	if progress != nil {
		e.cfg.Progress = progress
	}
}

// wall reads the wall clock (Config.Clock, even when a virtual clock
// replaced it for request timestamps); the zero time when nothing uses the
// wall clock (timed false: a virtual clock without log or callback).
func (e *Executor) wall() time.Time {
	if !e.timed {
		return time.Time{}
	}
	if e.wallClock != nil {
		return e.wallClock()
	}
	return e.cfg.Clock()
}

// multi: more than one rank (the world collectives C2/C3 run; under
// attention DP they ride C1, gatherStatesAndArrivals).
func (e *Executor) multi() bool { return e.cfg.Ranks > 1 }

// adp: attention data parallelism — each rank owns its requests and the tp
// collectives C1, C5, C7, C8 run. Helix CP ranks hold replicas instead.
func (e *Executor) adp() bool { return e.cfg.Ranks > 1 && !e.cfg.Helix }

// allGatherDecoded is an allgather followed by decode. On a communicator
// that shares results between in-process members (nccl.SharedGatherer),
// decode runs once for the whole fleet and the result is shared, so decode
// must depend on its argument only and its result must be read-only.
func (e *Executor) allGatherDecoded(name string, data []byte, decode func([][]byte) (any, error)) (any, error) {
	if e.sharedComm != nil {
		return e.sharedComm.AllGatherDecoded(name, data, decode)
	}
	all, err := e.d.Comm.AllGather(name, data)
	if err != nil {
		return nil, err
	}
	return decode(all)
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
	e.unindex(r)
}

// idCacheSize is the number of slots of Executor.idCache.
const idCacheSize = 512

// index makes r findable by its id.
func (e *Executor) index(r *request) {
	e.byID[r.ID] = r
	e.idCache[r.ID%idCacheSize] = r
}

// unindex forgets r's id.
func (e *Executor) unindex(r *request) {
	delete(e.byID, r.ID)
	if slot := &e.idCache[r.ID%idCacheSize]; *slot == r {
		*slot = nil
	}
}

// request returns the active request (or dummy) id, nil when none: one
// load and one compare for most ids (the map's probe is a cache miss per
// scheduled request after an engine step).
func (e *Executor) request(id uint64) *request {
	slot := &e.idCache[id%idCacheSize]
	if r := *slot; r != nil && r.ID == id {
		return r
	}
	r := e.byID[id]
	if r != nil {
		*slot = r
	}
	return r
}
