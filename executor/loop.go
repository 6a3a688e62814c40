package executor

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/internal/cputime"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// The loop skeleton (executor.md §5, §6; DESIGN.md §2): Run drives
// iterations until every rank agreed to exit; each iteration runs the shared
// prologue (intake, route, schedule, agree) and then the non-overlap or the
// overlap tail (step, apply, responses, events, log record).

// Run drives the loop until rank 0's source is exhausted and every rank has
// drained. Every rank returns in the same iteration.
func (e *Executor) Run() (*Result, error) {
	if e.cfg.Rank == 0 && e.d.Source == nil {
		return nil, errors.New("executor: rank 0 needs a request source")
	}
	if o, ok := e.d.Engine.(bridge.ThreadOwner); ok && e.cfg.EngineThread {
		var res *Result
		err := o.RunOnEngineThread(func() error {
			var err error
			res, err = e.run(true)
			return err
		})
		return res, err
	}
	return e.run(false)
}

// run is Run on the caller's goroutine; onEngineThread: that goroutine is
// the engine's, locked to its thread (Config.EngineThread).
func (e *Executor) run(onEngineThread bool) (*Result, error) {
	// The host time of an iteration is the loop thread's CPU clock
	// (hostCPU), which measures this goroutine only while it keeps its
	// thread (Config.ThreadLocked, or the engine's thread); wall time
	// otherwise. Read only where something uses it: each reading is a
	// system call, two per collective.
	locked := e.cfg.ThreadLocked || onEngineThread
	e.cpuClock = locked && (e.cfg.IterLog != nil || e.measuredHost()) && cputime.Available()
	if r, ok := e.d.Engine.(bridge.NativeCPUReporter); ok && onEngineThread && e.cpuClock {
		e.engineCPU = r // its compute runs on the loop thread: not host time
	}
	for {
		if onEngineThread {
			e.yieldIfDue()
		}
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
	if e.bal.n > 0 {
		e.res.TokenBalance = e.bal.tokenSum / float64(e.bal.n)
	}
	e.res.BalanceIterations, e.res.ForwardMS, e.res.SOLForwardMS = e.bal.n, e.bal.forwardMS, e.bal.solMS
	if e.calib != nil {
		if r, ok := e.calib.cal.LastRefresh(); ok {
			e.res.CostLastRefit = "published"
			if r.Reason != "" {
				e.res.CostLastRefit = r.Reason
			}
		}
	}
	return &e.res, nil
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

// plan is the part of an iteration shared by both loops (§5 steps 1–7, §6
// steps 1–8): fetch and route, padding, scheduling, recompute resets and the
// agreement on whether the fleet runs a forward.
type plan struct {
	start            time.Time     // the iteration's start on the loop's clock (virtual or wall)
	wallStart        time.Time     // the same on the wall clock (host time)
	cpuStart         time.Duration // the loop thread's CPU clock at the start (when e.cpuClock)
	out              *scheduler.Output
	fleetWork        bool
	canQueue         bool // agreed
	canQueueThisRank bool // local
	rec              *IterRecord
	stats            RankState
	fleetMS          float64 // virtual clock: the launched step's agreed duration
	held             bool    // ADP Balance held the contexts of this pass
	leveled          bool    // cost leveling deferred a first chunk of this pass
}

// prologue runs the shared part. It returns nil when the loop exits.
func (e *Executor) prologue() (*plan, error) {
	// The plan lives for one iteration (nothing keeps p): one per executor,
	// so that a steady-state iteration allocates nothing.
	p := &e.planBuf
	*p = plan{start: e.cfg.Clock(), wallStart: e.wall()}
	if e.cpuClock {
		p.cpuStart, _ = cputime.Thread()
	}
	e.waitDur, e.waitCPU = 0, 0
	if e.engineCPU != nil {
		e.engineCPUStart = e.engineCPU.NativeCPU()
	}
	// A watchdog comm names the iteration in its timeout reports.
	if e.iterComm != nil {
		e.iterComm.SetIteration(e.iter)
	}
	e.queueCancels = 0
	items, states, err := e.fetchAndRoute(p)
	if err != nil {
		return nil, err
	}
	p.fleetWork = e.fleetHasWork(items, states)
	if e.shutdown && !p.fleetWork {
		return nil, nil // agreed: every rank saw the same states and broadcast
	}
	// Padding dummy.
	if e.adp() && p.fleetWork {
		e.padDummy()
	}
	if p.out, err = e.schedule(); err != nil {
		return nil, err
	}
	if e.adp() && (e.cfg.ADPBalance.Enable || e.cfg.ADPBalance.CostLeveling) {
		if p.canQueue, p.canQueueThisRank, p.held, p.leveled, err = e.canQueueBalanced(p.out); err != nil {
			return nil, err
		}
	} else if p.canQueue, p.canQueueThisRank, err = e.canQueue(p.out.NumFitting); err != nil {
		return nil, err
	}
	p.rec = e.newIterRecord(p.start, p.out, p.canQueue)
	p.stats = e.statsOf(p.out)
	return p, nil
}

// fetchAndRoute is the prologue's intake and routing (§5 step 2): C1, then
// C2/C3, then the calibrator's observation and this rank's admissions. It
// returns the broadcast arrivals and the gathered rank states; with a
// virtual clock p.start becomes rank 0's clock, agreed in the broadcast.
func (e *Executor) fetchAndRoute(p *plan) ([]Arrival, []RankState, error) {
	var items []Arrival
	var states []RankState
	var err error
	if e.adp() {
		items, states, err = e.gatherStatesAndArrivals(p.start)
	} else if states, _, err = e.gatherRankStates(nil); err == nil {
		items, err = e.fetchArrivals(p.start)
	}
	if err != nil {
		return nil, nil, err
	}
	if e.virtual != nil {
		p.start = e.vnow // rank 0's clock, agreed in the arrival broadcast
	}
	// The online calibrator sees the previous iteration's gathered
	// statistics before this pass is planned (§9.2, §10.2).
	if e.calib != nil {
		if err := e.observeCost(states); err != nil {
			return nil, nil, err
		}
	}
	if e.adp() {
		e.route(items, states)
	} else {
		e.admitUpToCap(items, states[0])
	}
	return items, states, nil
}

// fleetHasWork reports whether any rank has work in this iteration. It
// reads only agreed values (the broadcast items, the waiting queue every
// rank holds and what this iteration routed from it, the gathered states;
// without attention DP the replicated requests), so every rank gets the same
// answer. The states were gathered before routing: requests routed from the
// queue in this iteration are in none of them, and without counting them a
// fleet whose ranks all went idle as the source ran dry exited with them
// admitted and never run. Queued requests cancelled in this iteration are
// answered at its response gather, which the loop must reach.
func (e *Executor) fleetHasWork(items []Arrival, states []RankState) bool {
	work := len(items) > 0 || e.waiting.Len() > 0 || (e.adp() && e.routed > 0) || e.queueCancels > 0
	for i := 0; i < len(states) && !work; i++ {
		work = states[i].ActiveRequests > 0 || states[i].RetiringRequests > 0
	}
	if !e.adp() {
		work = work || e.hasRealWork() // identical on every CP rank
	}
	return work
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
		if err := e.idleDoorbell(); err != nil {
			return false, err
		}
	} else {
		e.idleRun = 0
	}
	e.iter++
	return true, nil
}

// nonOverlapTail is §5 steps 8–12: every collective sits under the agreed
// can_queue or runs unconditionally.
func (e *Executor) nonOverlapTail(p *plan) error {
	var deviceMS float64
	var tokens int64
	if p.canQueue {
		b, err := e.prepareBatch(p.out, p)
		if err != nil {
			return err
		}
		tokens = b.tokens
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
			e.advance(fleet + e.virtualHostMS(p))
		}
		e.markLaunched(b)
		if deviceMS, err = e.applyResults(b, &e.stepRes); err != nil {
			return err
		}
		if err := e.gatherResponses("responses", e.finished, 0, 0, false); err != nil {
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
			e.advance(e.virtualHostMS(p))
		}
	}
	e.finished = e.finished[:0]
	if err := e.gatherResponses("pending_responses", e.pending, int64(deviceMS*1000), tokens, p.canQueue); err != nil {
		return err
	}
	e.pending = e.pending[:0]
	return e.writeIterRecord(p.rec, p)
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
	var tokens int64
	if processed {
		tokens = e.prev.tokens
		res := &e.waitRes
		if err := e.d.Engine.Wait(res); err != nil {
			return err
		}
		if deviceMS, err = e.applyResults(e.prev, res); err != nil {
			return err
		}
	}
	// 12: pending responses, always (with the processed batch's busy time).
	if err := e.gatherResponses("pending_responses", e.pending, int64(deviceMS*1000), tokens, processed); err != nil {
		return err
	}
	e.pending = e.pending[:0]
	// 13–14: launch, then the state updates of the launch.
	if p.canQueue {
		if err := e.launch(p, b); err != nil {
			return err
		}
	}
	// 15: exactly one response gather in either branch.
	if err := e.answerPrevious(processed); err != nil {
		return err
	}
	if e.costPlan != nil {
		return fmt.Errorf("executor: iteration %d: the launched step's cost was not agreed", e.iter)
	}
	// 16: exactly once per iteration, right after the previous-batch branch.
	if err := e.addKVCacheEventsSynced(processed); err != nil {
		return err
	}
	if !p.canQueue {
		// An iteration without a forward logs at its own end (§13.1).
		if err := e.writeIterRecord(p.rec, p); err != nil {
			return err
		}
	}
	// The host schedules the next iteration while the device runs this
	// one: the iteration lasts the longer of the two.
	if e.virtual != nil {
		e.advance(max(p.fleetMS, e.virtualHostMS(p)))
	}
	// 17.
	switch {
	case p.canQueue:
		e.timeIterRecord(p.rec, p)
		e.prev = b
	case processed:
		e.prev = nil
	}
	return nil
}

// launch is §6 steps 13–14: b goes to the engine asynchronously (with a
// virtual clock, the fleet agrees on its duration, "step_cost"), then the
// state updates of the launch.
func (e *Executor) launch(p *plan, b *batch) error {
	if err := e.buildStep(b); err != nil {
		return err
	}
	if err := e.d.Engine.Submit(&e.step); err != nil {
		return err
	}
	if e.virtual != nil {
		if e.fusedStepCost() {
			e.costPlan = p // agreed in this iteration's C7 (answerPrevious)
		} else {
			var err error
			if p.fleetMS, err = e.fleetStepMS(p.rec); err != nil {
				return err
			}
		}
	}
	e.markLaunched(b)
	return nil
}

// answerPrevious is §6 step 15: exactly one response gather (C7) in either
// branch. With the previous batch processed it carries that batch's
// completions, and the batch's iteration record is written; otherwise it
// is empty and only pairs the gather.
func (e *Executor) answerPrevious(processed bool) error {
	if processed {
		if err := e.gatherResponses("responses", e.finished, 0, 0, false); err != nil {
			return err
		}
		if err := e.writeIterRecord(e.prev.rec, nil); err != nil { // timed at its launch
			return err
		}
	} else if err := e.gatherResponses("responses", nil, 0, 0, false); err != nil {
		return err
	}
	e.finished = e.finished[:0]
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

// idleWait paces an idle fleet: rank 0 sleeps until the next arrival, at
// most MaxIdleSleep (the others wait for it in the next iteration's
// collectives); a source that knows when a request comes (ArrivalWaiter)
// wakes it then.
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
	if d <= 0 {
		return
	}
	if w, ok := e.d.Source.(ArrivalWaiter); ok {
		w.WaitArrival(d)
		return
	}
	time.Sleep(d)
}

// idleDoorbellSlack is how much longer than rank 0's longest idle sleep
// the other ranks wait for its doorbell before they go on into the next
// collective anyway (which the watchdog guards).
const idleDoorbellSlack = time.Second

// idleDoorbellAfter is the idle iteration from which the doorbell runs, in
// a row: an idle spell shorter than rank 0's first idle sleeps (a client's
// next turn, the gaps of a steady stream) keeps the ranks in the
// collective, where a request that comes finds them at once; a longer one
// costs its first request at most one poll instead of a core per rank for
// the rest of the spell.
const idleDoorbellAfter = 3

// idleDoorbell follows an idle iteration (agreed: every rank calls it at
// the same iterations or none does) on a comm whose collectives spin while
// they wait (MPI): from the idleDoorbellAfter-th idle iteration in a row,
// the ranks other than rank 0 wait for rank 0's next iteration asleep, rung
// by rank 0 once its idle wait has ended, instead of holding a core each in
// the first collective of that iteration (nccl.IdleWaiter).
func (e *Executor) idleDoorbell() error {
	e.idleRun++
	if e.idleComm == nil || e.idleRun < idleDoorbellAfter {
		return nil
	}
	return e.idleComm.IdleWait(0, e.cfg.IdlePoll, e.cfg.MaxIdleSleep+idleDoorbellSlack)
}

// engineThreadYield is how often a loop that runs on the engine's thread
// (Config.EngineThread) lets the Go scheduler run: below the runtime's
// forced-preemption limit (10 ms on one scheduling tick). Such a loop never
// blocks on a one-rank fleet, so without it the runtime's monitor takes it
// for a goroutine that hogs its processor and takes the processor away
// during the next engine call, every 10 ms: on a shared 2-core machine
// that cost 0.3-0.4 ms of CPU per 7 ms decode step, where a yield costs
// tens of microseconds (BenchmarkDecodeHostOverheadCPU, docs/scheduling.md).
const engineThreadYield = 5 * time.Millisecond

// yieldIfDue yields the processor once engineThreadYield has passed since
// the last yield (wall clock: only native engines own their thread, never
// a virtual-clock run).
func (e *Executor) yieldIfDue() {
	if now := time.Now(); now.Sub(e.lastYield) >= engineThreadYield {
		runtime.Gosched()
		e.lastYield = now
	}
}

// measuredHost reports whether virtual iterations take the measured host
// time (Config.MeasuredHostTime).
func (e *Executor) measuredHost() bool { return e.virtual != nil && e.cfg.MeasuredHostTime }

// hostCPU is the loop thread's CPU time since p started, less the CPU time
// of the engine's native calls when they run on that thread
// (Config.EngineThread) and the CPU time inside the iteration's collectives
// (in-process coroutine ranks share one thread, and run each other while
// one waits in a collective; a wait on other processes costs no CPU), or
// the wall time when there is no thread CPU clock (the thread is not
// locked, or the platform has none).
func (e *Executor) hostCPU(p *plan) time.Duration {
	if e.cpuClock {
		if now, ok := cputime.Thread(); ok {
			d := now - p.cpuStart - e.waitCPU
			if e.engineCPU != nil {
				d -= e.engineCPU.NativeCPU() - e.engineCPUStart
			}
			return d
		}
	}
	return e.wall().Sub(p.wallStart)
}

// virtualHostMS is the host time of p's iteration on the virtual clock:
// the engine's modelled constant, or the measured host CPU time so far
// (Config.MeasuredHostTime).
func (e *Executor) virtualHostMS(p *plan) float64 {
	if e.cfg.MeasuredHostTime {
		return float64(e.hostCPU(p)) / 1e6
	}
	return e.virtual.HostMS()
}

// waitMark is the start of a collective wait (waitStart, waitEnd).
type waitMark struct {
	wall time.Time
	cpu  time.Duration
}

// waitStart marks the start of a collective wait.
func (e *Executor) waitStart() waitMark {
	if !e.timed {
		return waitMark{} // nothing reads wait_ms (nor measures host time)
	}
	m := waitMark{wall: e.wall()}
	if e.cpuClock {
		m.cpu, _ = cputime.Thread()
	}
	return m
}

// waitEnd books a collective wait begun at m: its wall time (wait_ms) and
// the thread CPU time spent inside it (left out of host_ms).
func (e *Executor) waitEnd(m waitMark) {
	if !e.timed {
		return
	}
	e.waitDur += e.wall().Sub(m.wall)
	if e.cpuClock {
		if c, ok := cputime.Thread(); ok {
			e.waitCPU += c - m.cpu
		}
	}
}
