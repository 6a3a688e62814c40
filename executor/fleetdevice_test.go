package executor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/workload"
)

// timedEngine is the fake engine reporting a device time of ms per step.
type timedEngine struct {
	bridge.Engine
	ms float64
}

func (t *timedEngine) Step(d *bridge.StepDesc, r *bridge.StepResult) error {
	err := t.Engine.Step(d, r)
	r.DeviceMS = t.ms
	return err
}

func (t *timedEngine) Wait(r *bridge.StepResult) error {
	err := t.Engine.Wait(r)
	r.DeviceMS = t.ms
	return err
}

// runTimedFleet runs three ranks of the fake engine whose rank k reports
// 1 + 2k ms per step, and requires that no rank failed.
func runTimedFleet(t *testing.T, reqs []workload.Request, overlap bool) *fleet {
	f := &fleet{ranks: 3, reqs: reqs, overlap: overlap,
		newEngine: func(rank int, cfg bridge.Config) (bridge.Engine, error) {
			e, err := fake.New(cfg)
			return &timedEngine{Engine: e, ms: float64(1 + 2*rank)}, err
		}}
	return f.mustRun(t)
}

// TestFleetDeviceMS (issue 23, defect 16): every rank's record of an
// iteration with a forward carries the fleet's time for it, the slowest
// rank's device time, in both loops; device_ms stays the rank's own.
func TestFleetDeviceMS(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		f := runTimedFleet(t, sampleRequests(t, 12, 0.02), overlap)
		forwards := 0
		for rank, w := range f.iterLog {
			for _, line := range w.lines {
				var rec IterRecord
				require.NoError(t, json.Unmarshal(line, &rec))
				if rec.DeviceMS == nil {
					require.Nil(t, rec.FleetDeviceMS, "no forward, no fleet time")
					continue
				}
				forwards++
				require.Equal(t, float64(1+2*rank), *rec.DeviceMS, "device_ms is the rank's own")
				require.NotNil(t, rec.FleetDeviceMS)
				require.Equal(t, 5.0, *rec.FleetDeviceMS, "rank %d iteration %d (overlap %v): the slowest rank's", rank, rec.Iter, overlap)
			}
		}
		require.Positive(t, forwards)
	}
}
