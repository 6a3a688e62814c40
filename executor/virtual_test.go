package executor

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/workload"
)

// costEngine gives an engine a cost model for the virtual clock: a step
// costs 1 ms + 0.5 ms per new token (rank-local); the fleet's step lasts
// the slowest rank's; the host adds 0.25 ms per iteration.
type costEngine struct {
	bridge.Engine
	lastMS float64
}

func stepMS(d *bridge.StepDesc) float64 {
	ms := 1.0
	for _, s := range d.Seqs {
		ms += 0.5 * float64(len(s.Tokens))
	}
	return ms
}

func (c *costEngine) Step(d *bridge.StepDesc, r *bridge.StepResult) error {
	c.lastMS = stepMS(d)
	if err := c.Engine.Step(d, r); err != nil {
		return err
	}
	r.DeviceMS = c.lastMS
	return nil
}

func (c *costEngine) Submit(d *bridge.StepDesc) error {
	c.lastMS = stepMS(d)
	return c.Engine.Submit(d)
}

func (c *costEngine) AppendStepCost(b []byte) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(c.lastMS))
}

func (c *costEngine) FleetStepMS(costs [][]byte) (float64, error) {
	ms := 0.0
	for _, b := range costs {
		if len(b) != 8 {
			return 0, errors.New("bad cost")
		}
		ms = max(ms, math.Float64frombits(binary.LittleEndian.Uint64(b)))
	}
	return ms, nil
}

func (c *costEngine) HostMS() float64 { return 0.25 }

func (c *costEngine) CoupledForward() bool { return false }

func traceSource(epoch time.Time, reqs ...workload.Request) *TraceSource {
	return NewTraceSource(reqs, epoch)
}

// TestVirtualClockTimeline pins the virtual timeline of one request: an
// 8-token prompt (5 ms step + 0.25 ms host) then two decode steps (1.5 +
// 0.25 ms each), arriving 10 s into the trace. The idle period is jumped,
// not slept, and the latencies are exact.
func TestVirtualClockTimeline(t *testing.T) {
	epoch := time.Unix(1_000_000, 0)
	p := arrival(0, 8, 3).Prompt
	for _, overlap := range []bool{false, true} {
		src := traceSource(epoch, workload.Request{Index: 0, Arrival: 10 * time.Second, Prompt: p, MaxNewTokens: 3})
		g := (&rig{n: 1, overlap: overlap, src: src, virtual: &epoch,
			wrapEng: func(_ int, e bridge.Engine) bridge.Engine { return &costEngine{Engine: e} }}).build(t)
		start := time.Now()
		g.run()
		g.requireNoErrors(t)
		require.Less(t, time.Since(start), 5*time.Second, "the idle 10 s must be jumped, not slept")
		out := g.outputs(t)[0]
		arrive := epoch.Add(10 * time.Second).UnixNano()
		require.Equal(t, arrive, out.ArrivalUnixNS)
		ttft := float64(out.FirstTokenUnixNS-arrive) / 1e6
		e2e := float64(out.FinishUnixNS-arrive) / 1e6
		if !overlap {
			// 5 + 0.25; then 2 × (1.5 + 0.25).
			require.InDelta(t, 5.25, ttft, 1e-6)
			require.InDelta(t, 8.75, e2e, 1e-6)
		} else {
			// The host's 0.25 ms hides under the device's step: the first
			// token is there when the 5 ms context step ends; each decode
			// adds 1.5 ms.
			require.InDelta(t, 5.0, ttft, 1e-6)
			require.InDelta(t, 8.0, e2e, 1e-6)
		}
		require.Equal(t, []int32(out.Output), g.ranks[0].res.Responses[0].Output)
	}
}

// TestVirtualClockRanksAgree: on 3 ranks with unequal work every rank ends
// on the same virtual clock, the fleet's modelled time is the sum of the
// slowest rank's steps, and outputs equal the wall-clock run.
func TestVirtualClockRanksAgree(t *testing.T) {
	epoch := time.Unix(2_000_000, 0)
	var reqs []workload.Request
	var arrivals []Arrival
	for i := 0; i < 9; i++ {
		a := arrival(uint64(i), 4+5*i, 2+i%3)
		arrivals = append(arrivals, a)
		reqs = append(reqs, workload.Request{Index: i, Arrival: time.Duration(i/3) * 100 * time.Millisecond, Prompt: a.Prompt, MaxNewTokens: a.MaxNewTokens})
	}
	ref := (&rig{n: 1, src: allAtOnce(arrivals...)}).build(t)
	ref.run()
	ref.requireNoErrors(t)
	want := ref.outputs(t)
	for _, overlap := range []bool{false, true} {
		g := (&rig{n: 3, overlap: overlap, src: traceSource(epoch, reqs...), virtual: &epoch,
			wrapEng: func(_ int, e bridge.Engine) bridge.Engine { return &costEngine{Engine: e} }}).build(t)
		g.run()
		g.requireNoErrors(t)
		g.requireEqualTraces(t)
		for _, rr := range g.ranks[1:] {
			require.Equal(t, g.ranks[0].res.VirtualEnd, rr.res.VirtualEnd, "rank %d clock", rr.rank)
			require.Equal(t, g.ranks[0].res.VirtualDeviceMS, rr.res.VirtualDeviceMS)
		}
		require.Greater(t, g.ranks[0].res.VirtualDeviceMS, 0.0)
		require.True(t, g.ranks[0].res.VirtualEnd.After(epoch.Add(200*time.Millisecond)))
		got := g.outputs(t)
		for id, r := range want {
			require.Equal(t, r.Output, got[id].Output, "request %d", id)
			require.GreaterOrEqual(t, got[id].FirstTokenUnixNS, got[id].ArrivalUnixNS)
			require.GreaterOrEqual(t, got[id].FinishUnixNS, got[id].FirstTokenUnixNS)
		}
		// Every collective of the virtual clock is in the trace: the
		// sequential loop agrees each forward's duration in "step_cost";
		// the overlap loop's rides the response gather that follows the
		// launch (fusedStepCost), one per iteration.
		steps, responses := 0, 0
		for _, e := range g.ranks[0].comm.Trace() {
			switch e.Name {
			case "step_cost":
				steps++
			case "responses":
				responses++
			}
		}
		if overlap {
			require.Zero(t, steps)
			require.GreaterOrEqual(t, responses, int(g.ranks[0].res.ForwardIterations))
		} else {
			require.Equal(t, int(g.ranks[0].res.ForwardIterations), steps)
		}
	}
}

// The twin engine is the production StepCoster.
var _ StepCoster = (*twin.Engine)(nil)
