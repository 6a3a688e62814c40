package executor

import (
	"time"
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
	e.res.VirtualDeviceMS += fleet
	if rec != nil {
		rec.fleetMS = fleet
	}
	return fleet, nil
}

// advance moves the virtual clock by ms (rounded to the nanosecond the same
// way on every rank).
func (e *Executor) advance(ms float64) {
	e.vnow = e.vnow.Add(time.Duration(ms * float64(time.Millisecond)))
}
