package fleet

import (
	"io"
	"runtime"
	"sync"
	"time"

	"go.uber.org/zap"

	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// runInProcess runs every rank in this process over one local group and
// returns rank 0's result. Every rank is built before any runs, so a bad
// configuration fails before any collective; a failing rank closes its
// communicator so that its peers fail fast instead of waiting for the
// watchdog.
func runInProcess(o *Options, sc scheduler.Config, reqs []workload.Request, log *zap.Logger, stderr io.Writer,
	getenv func(string) string) (*Result, error) {
	world := o.world()
	comms, coro := o.inProcessComms(world)
	cpGroup, closeGroups, err := o.openInProcessGroups(world)
	if err != nil {
		return nil, err
	}
	defer closeGroups()
	setup := &rankSetup{o: o, sc: o.helixConfig(sc), cpGroup: cpGroup, log: log, fault: o.fault, td: newTeardown(),
		getenv: getenv}
	start := time.Now()
	prog := newProgress(stderr, o.Progress, len(reqs))
	o.logServing(log, len(reqs), zap.Skip())

	results := make([]*executor.Result, world)
	errs := make([]error, world)
	runRank := func(i int) {
		results[i], errs[i] = setup.runLocalRank(i, comms[i], reqs, prog)
		if errs[i] != nil {
			setup.td.fire()
			comms[i].Close() // wake peers blocked on this rank
		}
	}
	if coro != nil {
		// The coroutine ranks run on o.twinThreads drivers. Where a rank's
		// host time is measured (iteration log, --twin-host-time measured)
		// each driver is locked to its thread, whose CPU clock then times
		// only its ranks' host work (executor.Config.ThreadLocked).
		threads := o.twinThreads(world)
		locked := threads == 1 || o.IterLog != "" || o.TwinHostTime == "measured"
		setup.threadLocked, setup.coroutines = locked, true
		runtime.LockOSThread()
		nccl.RunCoroutinesParallel(coro, threads, locked, func(i int, _ *nccl.CoroComm) error { runRank(i); return nil })
		runtime.UnlockOSThread()
	} else {
		setup.threadLocked = true
		var wg sync.WaitGroup
		for i := range world {
			wg.Go(func() {
				runtime.LockOSThread() // executor.Config.ThreadLocked: host_ms in CPU time
				defer runtime.UnlockOSThread()
				runRank(i)
			})
		}
		wg.Wait()
	}
	prog.done()
	for _, c := range comms {
		c.Close()
	}
	if err := firstRootCause(errs); err != nil {
		return nil, err
	}
	res := &Result{Rank0: results[0], Wall: time.Since(start)}
	for _, r := range results {
		res.DeviceMS = append(res.DeviceMS, r.DeviceMS)
	}
	return res, nil
}

// twinThreadsMinRanks is the smallest fleet whose coroutine ranks are
// spread over several threads by default: below it a round's work is too
// small to pay for the threads meeting at every collective. By default a
// thread drives at least twinRanksPerThread ranks, for the same reason (the
// meeting costs more with every thread; measured on 2 cores only).
const (
	twinThreadsMinRanks = 16
	twinRanksPerThread  = 8
)

// maxTwinThreads bounds --twin-threads.
const maxTwinThreads = 256

// twinThreads is how many threads drive a coroutine fleet of world ranks
// (--twin-threads; 0: one per usable core from twinThreadsMinRanks ranks,
// at most one per twinRanksPerThread ranks).
func (o *Options) twinThreads(world int) int {
	if o.TwinThreads > 0 {
		return o.TwinThreads
	}
	if world < twinThreadsMinRanks {
		return 1
	}
	return max(1, min(runtime.GOMAXPROCS(0), world/twinRanksPerThread))
}

// inProcessComms are the world's communicators. The twin's ranks run as
// coroutines of one goroutine (cheap collectives for fleets of many ranks,
// deterministic: coro is their group); the other engines' ranks each get a
// goroutine, as they would a process.
func (o *Options) inProcessComms(world int) (comms []nccl.Comm, coro *nccl.CoroGroup) {
	if o.Engine == "twin" {
		coro = nccl.NewCoroGroup(world, false)
		for i := range world {
			comms = append(comms, coro.Member(i))
		}
		return comms, coro
	}
	for _, c := range nccl.NewLocalGroup(world, nccl.LocalOptions{Timeout: o.CollectiveTimeout}) {
		comms = append(comms, c)
	}
	return comms, nil
}

// openInProcessGroups opens the engines' exchange groups of an in-process
// run: the expert-parallel group of a MoE model (o.epGroup) and the Helix
// CP group (returned; nil without Helix). closeGroups closes both.
func (o *Options) openInProcessGroups(world int) (cpGroup any, closeGroups func(), err error) {
	var closers []func()
	closeGroups = func() {
		for _, c := range closers {
			c()
		}
	}
	if g, err := o.openEPGroup(world); err != nil {
		return nil, closeGroups, err
	} else if g != nil {
		closers = append(closers, func() { g.Close() })
		o.epGroup = g
	}
	if o.CP > 1 {
		g, err := nativeengine.NewCPGroup(o.CP, o.CollectiveTimeout)
		if err != nil {
			closeGroups()
			return nil, func() {}, err
		}
		closers = append(closers, func() { g.Close() })
		cpGroup = g
	}
	return cpGroup, closeGroups, nil
}

// runLocalRank builds rank i, votes on the outcome with every other rank
// (so one failing rank makes all of them fail, before any loop
// collective), then runs it — as it would in a process of its own.
func (s *rankSetup) runLocalRank(i int, comm nccl.Comm, reqs []workload.Request, prog *progress) (*executor.Result, error) {
	parts, berr := s.build(i, i, comm, s.o.out.iterLog(i), s.o.out.eventSink(i))
	status := executor.InitOK
	if berr != nil {
		status = executor.InitAbort
	}
	if _, err := executor.InitVote(comm, status, berr); err != nil {
		if parts != nil {
			parts.close()
		}
		return nil, err
	}
	defer parts.close()
	if i == 0 {
		// The replay starts once every rank is built (InitVote is a
		// collective): engine creation, e.g. converting a checkpoint's
		// weights, is not request latency.
		s.o.setSource(parts.ex, reqs, time.Now(), prog)
	}
	if s.cpGroup != nil {
		if err := executor.AgreeScheduleCheck(comm, parts.ex.ScheduleCheck()); err != nil {
			return nil, err
		}
	}
	return parts.ex.Run()
}

// setSource gives rank 0 its requests: the HTTP API's, or the workload's
// replayed from start (the twin's epoch on its virtual clock).
func (o *Options) setSource(ex *executor.Executor, reqs []workload.Request, start time.Time, prog *progress) {
	if o.API != nil {
		ex.SetSource(o.API.Source(), nil)
		o.API.SetReady()
		return
	}
	var update func(int)
	if prog != nil {
		update = prog.update
	}
	ex.SetSource(executor.NewTraceSource(reqs, o.replayStart(start)), update)
}

// logServing says what the run serves (rank 0's process).
func (o *Options) logServing(log *zap.Logger, requests int, launcher zap.Field) {
	what := zap.Int("requests", requests)
	if o.API != nil {
		what = zap.String("requests", "over HTTP")
	}
	log.Info("serving", what, zap.Int("ranks", o.Ranks), zap.Int("cp", o.CP), launcher,
		zap.String("engine", o.Engine), zap.String("model", o.Model), zap.String("router", o.Router),
		zap.String("overlap", o.Overlap))
}
