package executor

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// TestOnlineCalibratorPublishesIdenticallyOnEveryRank is LC-06 end to end
// (router-and-calibration.md §10.3): 4 in-process attention-DP ranks of the
// twin, the first 600 requests of the conversation trace at real lengths
// with arrivals compressed 20×, ctx_cost.mode auto with the lockstep
// correction. Every rank publishes, at the same iteration, the same
// (O, D, B), and the scheduler uses it (the iteration logs would show the
// cap; here the notes carry every publication).
func TestOnlineCalibratorPublishesIdenticallyOnEveryRank(t *testing.T) {
	reqs := conversationTrace(t, 600)
	for i := range reqs {
		reqs[i].Arrival /= 20
	}
	sc := scheduler.Config{MaxBatchSize: 128, MaxNumTokens: 8192, ChunkedContext: true, ChunkUnitSize: 32,
		Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true, CostMode: scheduler.CostAuto}
	set := costfit.DefaultSettings(8192)
	set.MinSamples, set.Window, set.RefreshInterval = 64, 512, 64
	f := &twinFleet{ranks: 4, gpu: "h200", model: "llama-8b", reqs: reqs, overlap: true, sched: sc, costCal: &set}
	res, _ := f.run(t)
	require.Len(t, res.Responses, 600)
	pubs := func(notes []string) []string {
		var out []string
		for _, n := range notes {
			if strings.HasPrefix(n, "ctx_cost auto: published") {
				out = append(out, n)
			}
		}
		return out
	}
	base := pubs(f.notes[0])
	require.NotEmpty(t, base, "the calibrator never published on a saturated fleet")
	t.Logf("%d publications, first: %s", len(base), base[0])
	for r := 1; r < 4; r++ {
		require.Equal(t, base, pubs(f.notes[r]), "rank %d published differently", r)
	}
}

// TestCoupledForwardLogsTheFleetTime: with a mixture-of-experts model every
// rank's forward waits for every rank, so each rank's iteration log shows
// the fleet's step time as its device time (what a GPU measures, and the
// T(it) the offline calibration reads), in the overlap loop too, where the
// record is completed one iteration after its step was launched.
func TestCoupledForwardLogsTheFleetTime(t *testing.T) {
	reqs := conversationTrace(t, 200)
	sc := scheduler.Config{MaxBatchSize: 64, MaxNumTokens: 8192, ChunkedContext: true, ChunkUnitSize: 32,
		Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true}
	for _, overlap := range []bool{true, false} {
		f := &twinFleet{ranks: 8, gpu: "h200", model: "deepseek-v3", reqs: reqs, overlap: overlap, sched: sc}
		f.logs = make([]*recordingWriter, 8)
		for i := range f.logs {
			f.logs[i] = &recordingWriter{}
		}
		f.run(t)
		byIter := map[int64]map[float64]bool{}
		for _, w := range f.logs {
			for _, line := range w.lines {
				var rec IterRecord
				require.NoError(t, json.Unmarshal(line, &rec))
				if rec.DeviceMS == nil {
					continue
				}
				if byIter[rec.Iter] == nil {
					byIter[rec.Iter] = map[float64]bool{}
				}
				byIter[rec.Iter][*rec.DeviceMS] = true
			}
		}
		require.NotEmpty(t, byIter)
		for it, vals := range byIter {
			require.Len(t, vals, 1, "overlap %v iteration %d: ranks log different device times %v", overlap, it, vals)
		}
	}
}

// Item 5 of issue 21: a planner that cannot take the calibrator's
// publications is refused by New when ctx_cost.mode auto runs the online
// calibrator, with the setting and the planner's type named, instead of at
// the iteration of the first publication. A planner that forwards
// PublishCost, and the scheduler itself, are accepted.
func TestNewRefusesAPlannerWithoutPublications(t *testing.T) {
	pool, err := kvpool.New(kvpool.Config{NumPages: 16, TokensPerPage: 8})
	require.NoError(t, err)
	sc := defaultSched()
	sc.ChunkedContext, sc.CostMode = true, scheduler.CostAuto
	sch, err := scheduler.New(sc, pool)
	require.NoError(t, err)
	eng, err := fake.New(bridge.Config{Preset: "tiny", NumPages: 16, TokensPerPage: 8, Seed: 1})
	require.NoError(t, err)
	set := costfit.DefaultSettings(int64(sc.MaxNumTokens))
	build := func(p Planner, cal *costfit.Settings) error {
		_, err := New(Config{Rank: 0, Ranks: 1, Scheduler: sc, CostCalibration: cal},
			Deps{Engine: eng, KV: pool, Planner: p, Source: &scriptSource{}})
		return err
	}
	wrapped := &recPlanner{inner: sch, kv: pool} // Schedule only
	err = build(wrapped, &set)
	require.EqualError(t, err, "executor: ctx_cost.mode auto needs a planner that takes publications, got *executor.recPlanner")
	require.NoError(t, build(wrapped, nil), "without the calibrator nothing is published")
	require.NoError(t, build(sch, &set))
	require.NoError(t, build(&countingPlanner{inner: sch}, &set), "a wrapper that forwards PublishCost")
}
