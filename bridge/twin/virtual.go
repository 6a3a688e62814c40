package twin

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The twin engine is the executor's StepCoster: under a virtual clock every
// rank sends the cost of the step it launched to every rank, and every rank
// computes the same fleet duration with FleetStepMS. A StepCost is plain
// data, so it travels as a fixed-size little-endian record, the same in
// process and across processes.

// stepCostFields is the number of 8-byte fields of an encoded StepCost.
const stepCostFields = 15

// StepCostBytes is the size of an encoded StepCost.
const StepCostBytes = 8 * stepCostFields

// AppendBinary appends c's encoding (StepCostBytes bytes) to b.
func (c StepCost) AppendBinary(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(int64(c.Tokens)))
	b = binary.LittleEndian.AppendUint64(b, uint64(int64(c.Seqs)))
	for _, v := range [...]float64{c.GEMMMS, c.AttentionMS, c.NormMS, c.LMHeadMS, c.OverheadMS, c.CommMS,
		c.MoEMS, c.AllToAllMS, c.LeadMS, c.MoELayerMS, c.TailMS, c.DecodeKV, c.DecodeKVWindow} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// DecodeStepCost parses one encoded StepCost.
func DecodeStepCost(b []byte) (StepCost, error) {
	if len(b) != StepCostBytes {
		return StepCost{}, fmt.Errorf("twin: a step cost is %d bytes, got %d", StepCostBytes, len(b))
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	f := func(i int) float64 { return math.Float64frombits(u(i)) }
	c := StepCost{Tokens: int(int64(u(0))), Seqs: int(int64(u(1))),
		GEMMMS: f(2), AttentionMS: f(3), NormMS: f(4), LMHeadMS: f(5), OverheadMS: f(6), CommMS: f(7),
		MoEMS: f(8), AllToAllMS: f(9), LeadMS: f(10), MoELayerMS: f(11), TailMS: f(12), DecodeKV: f(13), DecodeKVWindow: f(14)}
	for i := 2; i < stepCostFields; i++ {
		if v := f(i); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return StepCost{}, fmt.Errorf("twin: step cost field %d is %v", i, v)
		}
	}
	if c.Tokens < 0 || c.Seqs < 0 {
		return StepCost{}, fmt.Errorf("twin: step cost of %d tokens, %d sequences", c.Tokens, c.Seqs)
	}
	return c, nil
}

// AppendStepCost appends the cost of the step launched last (Step or
// Submit) to b (executor.StepCoster).
func (e *Engine) AppendStepCost(b []byte) []byte { return e.launched.AppendBinary(b) }

// FleetStepMS decodes every rank's step cost (rank order) and returns the
// step's duration on the fleet (executor.StepCoster): Profile.FleetStepMS.
func (e *Engine) FleetStepMS(costs [][]byte) (float64, error) {
	if cap(e.fleet) < len(costs) {
		e.fleet = make([]StepCost, len(costs))
	}
	e.fleet = e.fleet[:len(costs)]
	for i, b := range costs {
		c, err := DecodeStepCost(b)
		if err != nil {
			return 0, fmt.Errorf("rank %d: %w", i, err)
		}
		e.fleet[i] = c
	}
	return e.p.FleetStepMS(e.fleet), nil
}

// LaunchedCost is the cost of the step launched last, as AppendStepCost
// encodes it (executor's in-process fleets share it unencoded).
func (e *Engine) LaunchedCost() StepCost { return e.launched }

// FleetStepMSOf is FleetStepMS on costs already decoded (rank order).
func (e *Engine) FleetStepMSOf(costs []StepCost) float64 { return e.p.FleetStepMS(costs) }

// HostMS is the profile's modelled host time of one iteration
// (executor.StepCoster).
func (e *Engine) HostMS() float64 { return e.p.HostOverheadMS.Value }

// CoupledForward reports whether the ranks' forwards synchronise inside
// the step: an MoE model's layers wait for every rank (executor.StepCoster).
func (e *Engine) CoupledForward() bool { return e.p.Kind == KindRoofline && e.p.Model.MoE() }
