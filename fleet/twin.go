package fleet

import (
	"time"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// The digital twin in the worker (docs/twin.md): `--engine twin` runs the
// production executor, scheduler, router, KV pool and collectives over the
// twin engine, whose steps cost what a GPU × model cost profile says, on a
// virtual clock; `worker twin-profile` prints a built-in profile or fits a
// linear one to a real engine's iteration logs.

// twinEpoch is the virtual clock's start: the same constant in every process
// of a run, so that every rank's timestamps agree under any launcher. Any
// instant works (latencies are differences); it must not be the zero Unix
// time, which the response records reserve for "no token".
var twinEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// twinProfile builds the run's cost profile: the --cost-profile file, or
// the built-in profile of --gpu × --model (with --tp), with expert
// parallelism over the run's ranks for an MoE model.
func (o *Options) twinProfile() (*twin.Profile, error) {
	var p *twin.Profile
	var err error
	if o.CostProfile != "" {
		if p, err = twin.LoadProfile(o.CostProfile); err != nil {
			return nil, usage.Errorf("--cost-profile: %v", err)
		}
	} else if p, err = twin.BuiltinProfile(o.GPU, o.Model, twin.Parallelism{TP: o.TP}); err != nil {
		return nil, usage.Errorf("--engine twin: %v", err)
	}
	if p, err = ApplyTwinDeployment(p, o.WeightDType, o.KVDType, o.GPUsPerNode, o.ExpertZipf, o.Src); err != nil {
		return nil, err
	}
	if p, err = ApplyTwinAttentionDP(p, o.TwinCUDAGraph, o.TwinCUDAGraphMaxBatch, o.TwinMoEPadding, o.Src); err != nil {
		return nil, err
	}
	if p, err = p.WithRanks(o.world()); err != nil {
		return nil, usage.Errorf("--engine twin: %v", err)
	}
	return p, nil
}

// ApplyTwinDeployment applies the deployment settings of the twin
// (--weight-dtype, --kv-dtype, --gpus-per-node, --expert-zipf) to a cost
// profile, the same for `worker run`, `worker twin-profile` and `worker
// eval`; src names where a setting came from (a flag or a config key). An
// unknown dtype or a value the profile refuses is a usage error naming it.
func ApplyTwinDeployment(p *twin.Profile, weight, kv string, gpusPerNode int, zipf float64, src func(string) string) (*twin.Profile, error) {
	w, err := twin.ParseDType(weight)
	if err != nil {
		return nil, usage.Errorf("%s: %v", src("weight-dtype"), err)
	}
	k, err := twin.ParseDType(kv)
	if err != nil {
		return nil, usage.Errorf("%s: %v", src("kv-dtype"), err)
	}
	if p, err = p.WithDTypes(w, k); err != nil {
		return nil, usage.Errorf("%s, %s: %v", src("weight-dtype"), src("kv-dtype"), err)
	}
	if gpusPerNode < 0 {
		return nil, usage.Errorf("%s must be at least 1 (or 0: the GPU's NVLink domain), got %d", src("gpus-per-node"), gpusPerNode)
	}
	if p, err = p.WithTopology(gpusPerNode); err != nil {
		return nil, usage.Errorf("%s: %v", src("gpus-per-node"), err)
	}
	if zipf > 4 || zipf != zipf {
		return nil, usage.Errorf("%s must be a Zipf exponent in [0, 4] (negative: the profile's), got %g", src("expert-zipf"), zipf)
	}
	if zipf >= 0 && !p.Model.MoE() {
		return nil, usage.Errorf("%s %g: model %s has no routed experts", src("expert-zipf"), zipf, p.Model.Name)
	}
	if p, err = p.WithExpertZipf(zipf); err != nil {
		return nil, usage.Errorf("%s: %v", src("expert-zipf"), err)
	}
	return p, nil
}

// ApplyTwinAttentionDP applies the twin's attention-DP coupling
// (--twin-cuda-graph, --twin-cuda-graph-max-batch-size,
// --twin-moe-dp-padding) to a cost profile; src names where a setting came
// from. A value the profile refuses is a usage error naming the setting.
func ApplyTwinAttentionDP(p *twin.Profile, graph string, graphMax int, moePadding bool, src func(string) string) (*twin.Profile, error) {
	if err := usage.OneOf(src("twin-cuda-graph"), graph, twin.GraphRank, twin.GraphFleet); err != nil {
		return nil, err
	}
	if graphMax < 0 {
		return nil, usage.Errorf("%s must be at least 1 (or 0: 128), got %d", src("twin-cuda-graph-max-batch-size"), graphMax)
	}
	if graphMax > 0 && graph != twin.GraphFleet {
		return nil, usage.Errorf("%s %d needs %s fleet", src("twin-cuda-graph-max-batch-size"), graphMax, src("twin-cuda-graph"))
	}
	if moePadding && !p.Model.MoE() {
		return nil, usage.Errorf("%s: model %s has no routed experts", src("twin-moe-dp-padding"), p.Model.Name)
	}
	a := p.AttentionDP // a --cost-profile file's own settings stay unless a flag sets one
	if graph == twin.GraphFleet {
		a.CUDAGraph, a.CUDAGraphMaxBatchSize = graph, graphMax
	}
	if moePadding {
		a.MoEPadding = true
	}
	q, err := p.WithAttentionDP(a)
	if err != nil {
		return nil, usage.Errorf("%s, %s: %v", src("twin-cuda-graph"), src("twin-moe-dp-padding"), err)
	}
	return q, nil
}

// modelShape is the shape of --model: a bridge preset, or (twin only) the
// twin's model of that name or of the --cost-profile.
func (o *Options) ModelShape() (bridge.ModelShape, error) {
	if o.loaded != nil {
		return o.loaded.Shape, nil
	}
	if o.Engine == "twin" {
		p := o.profile
		if p == nil {
			var err error
			if p, err = o.twinProfile(); err != nil {
				return bridge.ModelShape{}, err
			}
		}
		return p.Model.Shape(), nil
	}
	s, err := bridge.LookupPreset(o.Model)
	if err != nil {
		return bridge.ModelShape{}, usage.Errorf("--model: %v", err)
	}
	return s, nil
}

// twinPoolPages sizes each rank's pool from the profile's GPU memory
// (--pages 0 with --engine twin): the GPU's memory minus the rank's share
// of the weights and the stated reserve. A model that does not fit is
// refused with the numbers.
func twinPoolPages(p *twin.Profile, tokensPerPage int) (int, error) {
	n, err := p.PoolPages(tokensPerPage)
	if err != nil {
		return 0, usage.Errorf("--pages 0 with --engine twin: %v", err)
	}
	return n, nil
}

// validateTwin checks the twin's settings and builds its cost profile; with
// --pages 0 it sizes the pool from the profile's GPU memory here, the same
// for every rank of every process. Other engines refuse the twin's flags.
func (o *Options) validateTwin() error {
	if o.Engine != "twin" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"gpu", o.GPU != "h200"}, {"cost-profile", o.CostProfile != ""}, {"tp", o.TP != 1},
			{"weight-dtype", o.WeightDType != ""}, {"kv-dtype", o.KVDType != ""}, {"gpus-per-node", o.GPUsPerNode != 0},
			{"expert-zipf", o.ExpertZipf >= 0}, {"twin-cuda-graph", o.TwinCUDAGraph != twin.GraphRank},
			{"twin-cuda-graph-max-batch-size", o.TwinCUDAGraphMaxBatch != 0}, {"twin-moe-dp-padding", o.TwinMoEPadding},
			{"twin-threads", o.TwinThreads != 0}} {
			if f.set {
				return usage.Errorf("%s is a setting of the digital twin: it needs --engine twin (got %s %s)",
					o.Src(f.name), o.Src("engine"), o.Engine)
			}
		}
		return nil
	}
	if o.TP < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.Src("tp"), o.TP)
	}
	if o.CP > 1 {
		return usage.Errorf("%s %d with --engine twin: the twin models attention-DP ranks only (no Helix)", o.Src("cp"), o.CP)
	}
	p, err := o.twinProfile()
	if err != nil {
		return err
	}
	o.profile = p
	if o.Pages == 0 {
		if o.Pages, err = twinPoolPages(p, o.TokensPerPage); err != nil {
			return err
		}
	}
	return nil
}

// replayStart is the instant a trace replay starts from: now on a wall
// clock, the twin's epoch on its virtual clock.
func (o *Options) replayStart(now time.Time) time.Time {
	if o.Engine == "twin" {
		return twinEpoch
	}
	return now
}

// CalibSettings are the online calibrator's settings from the config file
// (scheduler.ctx_cost.*), with the defaults of §9.1. The lockstep
// correction is on by default: with one rank it changes nothing (§10.2).
type CalibSettings struct {
	Percentile, Hysteresis              float64
	MinSamples, Window, RefreshInterval int
	LockstepCorrection                  bool
}

// DefaultCalibSettings are the calibrator's settings of §9.1.
func DefaultCalibSettings() CalibSettings {
	return CalibSettings{Percentile: costfit.DefaultOnlinePercentile, Hysteresis: costfit.DefaultHysteresis,
		MinSamples: costfit.DefaultMinSamples, Window: costfit.DefaultWindow, RefreshInterval: costfit.DefaultRefreshInterval,
		LockstepCorrection: true}
}

// settings resolves the calibrator's settings for a token budget m.
func (c CalibSettings) settings(m int64) costfit.Settings {
	s := costfit.DefaultSettings(m)
	s.Percentile, s.Hysteresis = c.Percentile, c.Hysteresis
	s.MinSamples, s.Window, s.RefreshInterval = c.MinSamples, c.Window, c.RefreshInterval
	s.LockstepCorrection = c.LockstepCorrection
	return s
}

// validateCtxCost checks --ctx-cost and, in auto mode, that equal-cost
// chunking can act (chunked prefill and a finite token budget) and that the
// calibrator's settings are valid, naming where each came from.
func (o *Options) validateCtxCost() error {
	if o.badCostMode != "" {
		return usage.Errorf("%s %q is not allowed (allowed: off, manual, auto)", o.Src("ctx-cost"), o.badCostMode)
	}
	if o.Scheduler.CostMode != scheduler.CostAuto {
		return nil
	}
	switch {
	case !o.Scheduler.ChunkedContext:
		return usage.Errorf("%s auto needs chunked prefill (%s is off): equal-cost chunking caps chunks", o.Src("ctx-cost"), o.Src("chunked-prefill"))
	case o.Scheduler.MaxNumTokens == 0:
		return usage.Errorf("%s auto needs a token budget (%s is 0, unlimited): the calibrator fits full-budget iterations",
			o.Src("ctx-cost"), o.Src("max-num-tokens"))
	}
	if _, err := costfit.New(o.Calibration.settings(int64(o.Scheduler.MaxNumTokens))); err != nil {
		return usage.Errorf("scheduler.ctx_cost in %s: %v", o.ConfigPath, err)
	}
	return nil
}
