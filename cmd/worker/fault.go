package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// FaultEnv injects one fault for tests (never set it in production):
//
//	init:RANK          rank RANK's initialisation fails
//	stop:RANK:ITER     rank RANK stops entering collectives at iteration ITER
//	perturb:RANK:ITER  rank RANK's plan of iteration ITER differs from its peers'
//
// They prove that the other ranks exit with a clear error instead of hanging.
const FaultEnv = "LOCKSTEP_TEST_FAULT"

type fault struct {
	kind string
	rank int
	iter int64
}

func parseFault(v string) (*fault, error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ":")
	f := &fault{kind: parts[0]}
	bad := fmt.Errorf("%s=%q: want init:RANK, stop:RANK:ITER or perturb:RANK:ITER", FaultEnv, v)
	want := map[string]int{"init": 2, "stop": 3, "perturb": 3}[f.kind]
	if want == 0 || len(parts) != want {
		return nil, bad
	}
	var err error
	if f.rank, err = strconv.Atoi(parts[1]); err != nil || f.rank < 0 {
		return nil, bad
	}
	if want == 3 {
		if f.iter, err = strconv.ParseInt(parts[2], 10, 64); err != nil || f.iter < 0 {
			return nil, bad
		}
	}
	return f, nil
}

// faultyPlanner wraps a rank's scheduler to stop or perturb at an iteration.
type faultyPlanner struct {
	executor.Planner
	f        *fault
	iter     int64
	teardown <-chan struct{} // closed when the run is torn down
}

func (p *faultyPlanner) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	it := p.iter
	p.iter++
	if p.f.kind == "stop" && it == p.f.iter {
		<-p.teardown // stop entering collectives until the run is torn down
		return nil, fmt.Errorf("injected fault: rank %d stopped at iteration %d", p.f.rank, it)
	}
	out, err := p.Planner.Schedule(active, executing)
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
