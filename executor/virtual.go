package executor

import (
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/bridge/twin"
)

// StepCoster is an engine that models the duration of its steps instead of
// measuring them (the digital twin, bridge/twin). The executor's virtual
// clock needs the whole fleet's view of a step: under lockstep an iteration
// lasts as long as its slowest rank, and a mixture-of-experts layer waits
// for every rank's attention, so every rank's cost travels to every rank.
type StepCoster interface {
	// AppendStepCost appends the modelled cost of the step launched last
	// (Step or Submit) to b, encoded for the fleet allgather.
	AppendStepCost(b []byte) []byte
	// FleetStepMS combines every rank's encoded cost (rank order) into the
	// step's duration on the fleet, in ms. It must be a pure function of
	// its input, so that every rank computes the same value.
	FleetStepMS(costs [][]byte) (float64, error)
	// HostMS is the modelled control-plane time of one iteration, in ms.
	HostMS() float64
	// CoupledForward reports whether the ranks' forwards synchronise
	// inside the step (mixture-of-experts layers wait for every rank), so
	// that a GPU would measure the fleet's step time as every rank's device
	// time. Dense models' forwards are rank-local.
	CoupledForward() bool
}

// fleetStepMS is the virtual clock's collective ("step_cost", under the
// agreed can_queue, only with a virtual clock: configuration-identical on
// every rank): every rank's cost of the step it just launched, combined
// into the fleet's step duration. The record, when logging, gets the time
// this rank waited for the slowest one.

func (e *Executor) fleetStepMS(rec *IterRecord) (float64, error) {
	e.wire = e.virtual.AppendStepCost(e.wire[:0])
	mine := e.wire
	var fleet float64
	if e.multi() {
		// Every rank's engine models the same profile, so the fleet's
		// duration is the same whichever rank's engine computes it: a
		// coroutine fleet computes it once.
		t := e.waitStart()
		v, err := e.allGatherDecoded("step_cost", mine, func(all [][]byte) (any, error) {
			return e.virtual.FleetStepMS(all)
		})
		e.waitEnd(t)
		if err != nil {
			return 0, err
		}
		fleet = v.(float64)
	} else {
		var err error
		if fleet, err = e.virtual.FleetStepMS([][]byte{mine}); err != nil {
			return 0, err
		}
	}
	e.bookFleetStep(rec, fleet)
	return fleet, nil
}

// bookFleetStep books the agreed duration of the launched step.
func (e *Executor) bookFleetStep(rec *IterRecord, fleet float64) {
	e.res.VirtualDeviceMS += fleet
	if rec != nil {
		rec.fleetMS = fleet
	}
}

// fusedStepCost reports whether the launched step's cost rides the
// iteration's response gather (C7) instead of a "step_cost" allgather of
// its own: in the overlap loop under attention DP, where C7 runs in every
// iteration right after the launch and nothing between the two reads the
// fleet's step duration (it moves the clock at the iteration's end). A
// deliberate difference from executor.md §7's inventory: one collective
// less per forward on a virtual clock, the same values (issue 24 item 8).
// The sequential loop needs the duration before it applies the results,
// so it keeps "step_cost".
func (e *Executor) fusedStepCost() bool { return e.cfg.Overlap && e.adp() }

// gatherWithStepCost is C7 carrying the launched step's cost: e.wire (the
// response batch) gets the cost and its length appended, the fleet's step
// duration is computed once per gather (once per coroutine fleet) and
// booked on e.costPlan, and the response batches come back without the
// cost.
func (e *Executor) gatherWithStepCost(name string) ([][]byte, error) {
	p := e.costPlan
	e.costPlan = nil
	var v any
	var err error
	if e.slotCost != nil {
		// A coroutine fleet: the cost goes in this member's slot
		// instead of after the batch (fleetSlots).
		e.slots.costs[e.cfg.Rank] = e.slotCost.LaunchedCost()
		v, err = e.sharedComm.AllGatherDecoded(name, e.wire, e.joinCosts)
	} else {
		n0 := len(e.wire)
		e.wire = endTrailer(e.virtual.AppendStepCost(e.wire), n0)
		v, err = e.allGatherDecoded(name, e.wire, e.splitCosts)
	}
	if err != nil {
		return nil, err
	}
	g := v.(*costedGather)
	p.fleetMS = g.fleetMS
	e.bookFleetStep(p.rec, g.fleetMS)
	return g.batches, nil
}

// costedGather is a C7 result with the step costs taken off.
type costedGather struct {
	batches [][]byte
	fleetMS float64
}

// splitStepCosts splits every member's C7 payload into its response batch
// and its step cost, and combines the costs into the fleet's duration.
func (e *Executor) splitStepCosts(all [][]byte) (any, error) {
	g := &e.costedBuf[e.costedTurn]
	e.costedTurn ^= 1
	g.batches = append(g.batches[:0], all...)
	e.costSplit = e.costSplit[:0]
	for i, b := range all {
		batch, cost, ok := cutTrailer(b)
		if !ok {
			return nil, fmt.Errorf("collective desync: responses of rank %d (%d bytes) carry no step cost", i, len(b))
		}
		g.batches[i] = batch
		e.costSplit = append(e.costSplit, cost)
	}
	var err error
	g.fleetMS, err = e.virtual.FleetStepMS(e.costSplit)
	return g, err
}

// slotCoster is a StepCoster that costs an in-process fleet's step from
// the ranks' costs as they are (twin.Engine), put in fleetSlots.
type slotCoster interface {
	LaunchedCost() twin.StepCost
	FleetStepMSOf(costs []twin.StepCost) float64
}

// joinStepCosts is splitStepCosts for a coroutine fleet whose ranks put their
// step costs in e.slots: the gathered payloads are the response batches,
// and the fleet's duration comes from the slots, once per fleet.
func (e *Executor) joinStepCosts(all [][]byte) (any, error) {
	g := &e.costedBuf[e.costedTurn]
	e.costedTurn ^= 1
	g.batches = append(g.batches[:0], all...)
	g.fleetMS = e.slotCost.FleetStepMSOf(e.slots.costs)
	return g, nil
}

// advance moves the virtual clock by ms (rounded to the nanosecond the same
// way on every rank).
func (e *Executor) advance(ms float64) {
	e.vnow = e.vnow.Add(time.Duration(ms * float64(time.Millisecond)))
}
