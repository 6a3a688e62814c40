package fleet

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// FaultEnv injects one fault for tests (never set it in production):
//
//	init:RANK          rank RANK's initialisation fails
//	stop:RANK:ITER     rank RANK stops entering collectives at iteration ITER
//	perturb:RANK:ITER  rank RANK's plan of iteration ITER differs from its peers'
//	stall:RANK:ITER    rank RANK's engine stops inside its next in-step exchange
//	                   (Helix attention partials, MoE dispatch or combine) from
//	                   iteration ITER, for five collective timeouts
//	moe-stop:RANK:ITER:LAYER  the same at layer LAYER's MoE dispatch (a MoE
//	                   model under expert parallelism)
//
// They prove that the other ranks exit with a clear error instead of hanging.
// A fault that could never fire is refused at startup (checkFault), and one
// whose iteration the run never reached is reported when the run ends
// (unfiredWarning), so that a test cannot pass without its fault.
const FaultEnv = "LOCKSTEP_TEST_FAULT"

type fault struct {
	spec  string // the variable's value, for messages
	kind  string
	rank  int
	iter  int64
	layer int // moe-stop
	// hosted: a rank of this process carries the fault; fired: it was
	// injected. Set by the rank goroutines, read after they finish.
	hosted, fired atomic.Bool
}

func parseFault(v string) (*fault, error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ":")
	f := &fault{spec: v, kind: parts[0]}
	bad := func(why string) error {
		return fmt.Errorf("%s=%q: %s (want init:RANK, stop:RANK:ITER, perturb:RANK:ITER, stall:RANK:ITER or moe-stop:RANK:ITER:LAYER)", FaultEnv, v, why)
	}
	want := map[string]int{"init": 2, "stop": 3, "perturb": 3, "stall": 3, "moe-stop": 4}[f.kind]
	if want == 0 {
		return nil, bad(fmt.Sprintf("unknown kind %q", f.kind))
	}
	if len(parts) != want {
		return nil, bad(fmt.Sprintf("%s takes %d fields, got %d", f.kind, want, len(parts)))
	}
	var err error
	if f.rank, err = strconv.Atoi(parts[1]); err != nil || f.rank < 0 {
		return nil, bad(fmt.Sprintf("rank %q is not a non-negative integer", parts[1]))
	}
	if want >= 3 {
		if f.iter, err = strconv.ParseInt(parts[2], 10, 64); err != nil || f.iter < 0 {
			return nil, bad(fmt.Sprintf("iteration %q is not a non-negative integer", parts[2]))
		}
	}
	if want == 4 {
		if f.layer, err = strconv.Atoi(parts[3]); err != nil || f.layer < 0 {
			return nil, bad(fmt.Sprintf("layer %q is not a non-negative integer", parts[3]))
		}
	}
	return f, nil
}

// checkFault refuses a fault that could never fire in this run: a rank
// outside the world, or a perturbed plan that nothing compares (only the
// Helix schedule check, --cp > 1 with TLLM_HELIX_AGG_CHECK_SCHEDULE=1,
// compares plans across ranks; under attention DP every rank plans for its
// own requests).
//
// A stall needs an engine whose steps exchange data with other ranks (Helix
// CP, exchanges true).
func checkFault(f *fault, world int, helixScheduleCheck, exchanges bool) error {
	if f == nil {
		return nil
	}
	if f.rank >= world {
		return fmt.Errorf("%s=%q: rank %d is outside the world of %d ranks (0–%d); the fault would never fire",
			FaultEnv, f.spec, f.rank, world, world-1)
	}
	if f.kind == "perturb" && !helixScheduleCheck {
		return fmt.Errorf("%s=%q: perturb changes one rank's plan, which only the Helix schedule check compares; "+
			"it needs --cp > 1 and %s=1 (under attention DP, or without the check, nothing would notice)",
			FaultEnv, f.spec, executor.ScheduleCheckEnv)
	}
	if f.kind == "stall" && !exchanges {
		return fmt.Errorf("%s=%q: stall stops a rank inside an exchange of its engine's step, which only "+
			"Helix CP (--cp > 1) and MoE expert parallelism (a MoE model on --engine cpu with --ranks > 1) make", FaultEnv, f.spec)
	}
	return nil
}

// unfiredWarning is the warning for a fault hosted by this process that
// the run ended without injecting ("" otherwise).
func (f *fault) unfiredWarning() string {
	if f == nil || !f.hosted.Load() || f.fired.Load() {
		return ""
	}
	return fmt.Sprintf("%s=%q: the run ended before rank %d reached iteration %d; nothing was injected",
		FaultEnv, f.spec, f.rank, f.iter)
}

// faultyPlanner wraps a rank's scheduler to stop or perturb at an iteration.
// It forwards every capability of the scheduler the executor uses (the
// online calibrator's publications: executor.CostPublisher), so that a
// run with a fault that has not fired is the run without it.
type faultyPlanner struct {
	*scheduler.Scheduler
	f        *fault
	iter     int64
	teardown <-chan struct{} // closed when the run is torn down
	// stall: the rank's engine and how long it stops inside the exchange.
	eng      bridge.Engine
	stallFor time.Duration
}

var _ executor.CostPublisher = (*faultyPlanner)(nil)

// newFaultyPlanner wraps sch with fault f; teardown is closed when the run
// is torn down, eng is the rank's engine (stall) and stallFor how long a
// stall lasts.
func newFaultyPlanner(sch *scheduler.Scheduler, f *fault, teardown <-chan struct{}, eng bridge.Engine,
	stallFor time.Duration) *faultyPlanner {
	return &faultyPlanner{Scheduler: sch, f: f, teardown: teardown, eng: eng, stallFor: stallFor}
}

// Schedule is the scheduler's pass, with the fault injected at its iteration.
func (p *faultyPlanner) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	it := p.iter
	p.iter++
	if it == p.f.iter {
		p.f.fired.Store(true)
	}
	if p.f.kind == "stop" && it == p.f.iter {
		<-p.teardown // stop entering collectives until the run is torn down
		return nil, fmt.Errorf("injected fault: rank %d stopped at iteration %d", p.f.rank, it)
	}
	if (p.f.kind == "stall" || p.f.kind == "moe-stop") && it == p.f.iter {
		st, ok := p.eng.(bridge.ExchangeStaller)
		if !ok {
			return nil, fmt.Errorf("injected fault: the %T engine cannot stall inside an exchange", p.eng)
		}
		kind, layer := bridge.AnyExchange, -1
		if p.f.kind == "moe-stop" {
			kind, layer = bridge.MoEDispatchExchange, p.f.layer
		}
		if err := st.StallNextExchange(kind, layer, p.stallFor); err != nil {
			return nil, fmt.Errorf("injected fault: %w", err)
		}
	}
	out, err := p.Scheduler.Schedule(active, executing)
	if err == nil && p.f.kind == "perturb" && it == p.f.iter {
		out.SatOut = append(out.SatOut, &scheduler.Request{ID: 1<<62 + uint64(it)})
	}
	return out, err
}

// teardown is closed once, when the first rank fails.
type teardown struct {
	once sync.Once
	ch   chan struct{}
}

func newTeardown() *teardown { return &teardown{ch: make(chan struct{})} }
func (t *teardown) fire()    { t.once.Do(func() { close(t.ch) }) }
