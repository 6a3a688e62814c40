// Package executor runs one rank's iteration loop (shared/spec/executor.md):
// intake and routing, scheduling, the agreement on whether the fleet runs a
// forward, the engine step, applying results, responses and the iteration log.
// Every collective sits at a fixed program point entered by every rank under a
// condition that only depends on configuration or on agreed values (§7).
package executor

import (
	"errors"
	"fmt"
	"github.com/lockstep-ai/lockstep/structured"
	"io"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// KV is what the executor needs from the KV manager: the scheduler's narrow
// interface plus the page-table rows of the batch and bookkeeping after a step.
type KV interface {
	scheduler.KVManager
	// Capacity is id's (ledger) capacity in tokens.
	Capacity(id uint64) int
	// BlockTable returns id's page indices in order; valid until the next mutation.
	BlockTable(id uint64) []int32
	// AddDummy creates a padding sequence with capacity tokens.
	AddDummy(r *scheduler.Request, tokens int) bool
	// AvailableTokens is how many tokens could still be allocated.
	AvailableTokens() int
	// UpdateAfterContext records that r's chunk executed (ContextPosition advanced).
	UpdateAfterContext(r *scheduler.Request)
	// UpdateAfterGeneration records that r's generation step executed.
	UpdateAfterGeneration(r *scheduler.Request)
	// PagesToCompletion is ceil((PromptLen + MaxNewTokens) / ledger block).
	PagesToCompletion(r *scheduler.Request) int
	// Utilization is 1 − (free + cached reusable pages) / device pages.
	Utilization() float64
	// TotalPages, FreePages and CachedPages describe the device pool: a
	// cached page holds a committed block no sequence references (evictable).
	TotalPages() int
	FreePages() int
	CachedPages() int
	// TokensPerPage is P.
	TokensPerPage() int
	// TakeCopyRuns returns the page copies decided since the last call, in
	// the order they must run.
	TakeCopyRuns() []kvpool.CopyRun
	// EventsEnabled and FlushIterationEvents: the KV cache events (§9).
	EventsEnabled() bool
	FlushIterationEvents() []kvpool.Event
	// PrefixStats counts prompt tokens and reused tokens at admission.
	PrefixStats() kvpool.PrefixStats
	// ReusableBlocks is the number of blocks in the radix tree.
	ReusableBlocks() int
	// LedgerBlockTokens is the bookkeeping unit: P, or P·cp under Helix.
	LedgerBlockTokens() int
}

// Planner builds one rank's plan for an iteration (scheduler.Scheduler).
type Planner interface {
	Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error)
}

// Config configures one rank's executor.
type Config struct {
	// Rank and Ranks: this rank's index in the attention-DP group and its size.
	Rank, Ranks int
	// StopTokens are the model's end-of-generation tokens: a request whose
	// Arrival.StopAtEOS is set completes when it samples one.
	StopTokens []int32
	// Guides compiles the guides of structured outputs (Arrival.Guide) for
	// the model's vocabulary, whose end-of-generation tokens are
	// StopTokens; nil: guided arrivals are rejected.
	Guides *structured.Cache
	// Serving (serving.go). Stream gathers every produced token to rank 0
	// each iteration, where OnTokens receives them (request order within a
	// rank, ranks in order). OnResponse receives each answer on rank 0 as
	// it arrives; DiscardResponses then keeps them out of Result (a server
	// runs for ever). OnIteration receives the fleet's state on rank 0 at
	// the end of every iteration. The callbacks run on rank 0's loop
	// goroutine and must not block.
	Stream           bool
	OnTokens         func(deltas []TokenDelta)
	OnResponse       func(Response)
	DiscardResponses bool
	OnIteration      func(FleetStats)
	// Scheduler is the scheduler configuration (arrival validation reads it).
	Scheduler scheduler.Config
	// MaxSeqLen bounds prompt + 1 (arrival validation); 0 = unset: the KV
	// pool bounds the whole sequence instead.
	MaxSeqLen int
	// Helix makes the ranks one aggregated-Helix CP group (Ranks = cp):
	// every rank takes every request and schedules identically; attention
	// DP is off.
	Helix bool
	// MoE: the model is a mixture of experts whose engines exchange tokens
	// inside every step (expert parallelism over the attention-DP ranks).
	// Every rank already steps in every forward iteration (a rank without
	// work runs its padding dummy, C5), which the exchanges need; with MoE
	// the iteration log records moe_wait_ms.
	MoE bool
	// ScheduleCheck runs the per-iteration Helix schedule check (C4); decide
	// it with ScheduleCheckGate and agree on it with AgreeScheduleCheck.
	ScheduleCheck bool
	// Router places arrivals on ranks (scheduler/router); nil: the default
	// load-balanced router. Every rank must use an identically configured one.
	Router router.Router
	// MaxActivePerRank is the hard cap H of active requests per rank: the
	// routers' under attention DP, admission's without it (admitUpToCap);
	// the rest waits in the executor's queue.
	MaxActivePerRank int
	// Events turns on the rank-symmetric KV event flush (every rank must
	// agree); rank 0 writes the published stream to EventSink.
	Events             bool
	EventSink          EventSink
	EventBufferMaxSize int // per-rank entries per flush; 0 = unlimited
	// EventPublisher, when set, receives this rank's published events of
	// every flush that has any (attention DP: on every rank; otherwise on
	// rank 0 only), after the flush's collective: a local side effect that
	// changes nothing of the flush's symmetry (the ZeroMQ publisher of
	// serve/kvevents).
	EventPublisher EventPublisher
	// Overlap selects the overlap loop (§6): iteration N+1 is scheduled while
	// N runs on the engine. Otherwise the non-overlap loop (§5).
	Overlap bool
	// IterLog receives JSON Lines iteration records; nil disables the log.
	IterLog io.Writer
	// Progress is called on rank 0 after each iteration with the number of
	// responses received so far (may be nil).
	Progress func(done int)
	// OnNote receives the scheduler's log lines of every pass (may be nil).
	OnNote func(rank int, n scheduler.Note)
	// Clock returns the wall time; nil uses time.Now.
	Clock func() time.Time
	// VirtualClock runs the loop on a virtual, rank-agreed clock that starts
	// at VirtualEpoch: an iteration lasts the slowest rank's modelled step
	// time plus the modelled host time (overlap loop: the longer of the
	// two), idle periods jump to the next arrival and nothing sleeps. The
	// engine must implement StepCoster (the twin). Request timestamps, and
	// so TTFT, TPOT and E2E, are virtual; collective waits stay wall time.
	VirtualClock bool
	VirtualEpoch time.Time
	// MeasuredHostTime (virtual clock only): the host time of a virtual
	// iteration is this rank's measured control-plane CPU time of that
	// iteration (the executor thread's CPU clock, internal/cputime) instead
	// of the engine's modelled constant (twin: host_overhead_ms), so a slow
	// scheduler shows in the virtual latencies. The virtual timeline then
	// depends on the machine: runs are no longer reproducible to the
	// microsecond (the tokens are). docs/twin.md, --twin-host-time.
	MeasuredHostTime bool
	// ThreadLocked: Run is called on a goroutine locked to its OS thread
	// (runtime.LockOSThread), or as a coroutine of one (nccl.RunCoroutines;
	// coroutines may not change their locking, so Run cannot lock itself).
	// Then host_ms and MeasuredHostTime read the thread's CPU clock, less
	// the CPU inside collectives; otherwise they fall back to wall time.
	ThreadLocked bool
	// EngineThread runs the loop on the engine's own thread when the
	// engine has one (bridge.ThreadOwner, the native engine): every engine
	// call then runs in place instead of being handed to the engine's
	// goroutine and back (two thread wake-ups a call). The loop thread is
	// then locked, so host_ms reads its CPU clock as with ThreadLocked, less
	// the engine's own CPU (bridge.NativeCPUReporter). Leave it off for
	// ranks that run as coroutines (nccl.RunCoroutines): a coroutine may
	// not continue on another goroutine.
	EngineThread bool
	// CostCalibration, when set, runs the online context-cost calibrator
	// (Scheduler.CostMode must be auto): every rank feeds the gathered
	// statistics of the previous iteration and publishes the fitted (O, D)
	// to its planner (router-and-calibration.md §9–§10).
	CostCalibration *costfit.Settings
	// RecordBusy keeps every forward iteration's per-rank busy time on rank
	// 0 (Result.Busy; attention DP only).
	RecordBusy bool
	// ADPBalance is TensorRT-LLM's attention_dp_config balance (adpbalance.go);
	// off by default, and without attention DP it does nothing.
	ADPBalance ADPBalance
	// MaxIdleSleep bounds how long rank 0 sleeps waiting for the next arrival
	// while the fleet is idle (keeps collectives well inside the watchdog).
	MaxIdleSleep time.Duration
	// IdlePoll, when positive, lets the ranks other than rank 0 of an idle
	// fleet wait for its next iteration asleep, looking every IdlePoll,
	// where the comm's collectives would hold a core each (MPI;
	// nccl.IdleWaiter). Zero: they wait in the collective.
	IdlePoll time.Duration
}

// Deps are the components one rank's executor drives.
type Deps struct {
	Comm    nccl.Comm     // the attention-DP group (size Ranks)
	Engine  bridge.Engine // this rank's engine
	KV      KV            // this rank's KV manager
	Planner Planner       // this rank's scheduler
	// Source provides arrivals; read on rank 0 only (may be nil elsewhere).
	Source Source
}

func (c *Config) validate(d Deps) error {
	switch {
	case c.Ranks < 1:
		return fmt.Errorf("executor: ranks must be at least 1, got %d", c.Ranks)
	case c.Rank < 0 || c.Rank >= c.Ranks:
		return fmt.Errorf("executor: rank %d out of range [0, %d)", c.Rank, c.Ranks)
	case d.Comm == nil && c.Ranks > 1:
		return errors.New("executor: a communicator is required with more than one rank")
	case d.Comm != nil && (d.Comm.Size() != c.Ranks || d.Comm.Rank() != c.Rank):
		return fmt.Errorf("executor: communicator is rank %d of %d, config says %d of %d",
			d.Comm.Rank(), d.Comm.Size(), c.Rank, c.Ranks)
	case d.Engine == nil || d.KV == nil || d.Planner == nil:
		return errors.New("executor: engine, KV manager and planner are required")
	case c.ADPBalance.TimeoutIters < 0 || c.ADPBalance.BatchingWaitIters < 0:
		return fmt.Errorf("executor: attention_dp_config timeout_iters %d and batching_wait_iters %d must be ≥ 0",
			c.ADPBalance.TimeoutIters, c.ADPBalance.BatchingWaitIters)
	}
	return nil
}
