package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/lockstep-ai/lockstep/report"

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
func (o *serveOptions) twinProfile() (*twin.Profile, error) {
	var p *twin.Profile
	var err error
	if o.costProfile != "" {
		if p, err = twin.LoadProfile(o.costProfile); err != nil {
			return nil, usage.Errorf("--cost-profile: %v", err)
		}
	} else if p, err = twin.BuiltinProfile(o.gpu, o.model, twin.Parallelism{TP: o.tp}); err != nil {
		return nil, usage.Errorf("--engine twin: %v", err)
	}
	if p, err = p.WithRanks(o.world()); err != nil {
		return nil, usage.Errorf("--engine twin: %v", err)
	}
	return p, nil
}

// modelShape is the shape of --model: a bridge preset, or (twin only) the
// twin's model of that name or of the --cost-profile.
func (o *serveOptions) modelShape() (bridge.ModelShape, error) {
	if o.loaded != nil {
		return o.loaded.Shape, nil
	}
	if o.engine == "twin" {
		p := o.profile
		if p == nil {
			var err error
			if p, err = o.twinProfile(); err != nil {
				return bridge.ModelShape{}, err
			}
		}
		return p.Model.Shape(), nil
	}
	s, err := bridge.LookupPreset(o.model)
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

// runTwinProfile is `worker twin-profile`.
func runTwinProfile(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("twin-profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gpu := fs.String("gpu", "h200", "GPU: "+strings.Join(twin.GPUNames(), ", "))
	model := fs.String("model", "llama-8b", "model: "+strings.Join(twin.ModelNames(), ", "))
	tp := fs.Int("tp", 1, "tensor-parallel GPUs per attention-DP rank")
	ranks := fs.Int("ranks", 1, "attention-DP ranks (expert parallelism of an MoE model spans them)")
	measured := fs.String("measured", "", "re-base the built-in profile on a GPU's measured rates (the measured.json "+
		"scripts/device-check.sh writes: achieved GEMM and attention rates, decode bandwidth, step overhead)")
	fit := fs.Bool("fit", false, "fit a linear profile of the engine that wrote the iteration logs given as arguments "+
		"(files, or one path with {rank}); --model names the model they ran")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: worker twin-profile [--gpu G] [--model M] [--tp N] [--ranks R] [--measured FILE]\n"+
			"       worker twin-profile --fit [--model M] ITER_LOG...\n\n"+
			"Prints a cost profile of the digital twin as JSON (docs/twin.md).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if !*fit {
		if fs.NArg() > 0 {
			return usage.Errorf("unexpected arguments %v (iteration logs go with --fit)", fs.Args())
		}
		p, err := twin.BuiltinProfile(*gpu, *model, twin.Parallelism{TP: *tp})
		if err != nil {
			return usage.Wrap(err)
		}
		if p, err = p.WithRanks(*ranks); err != nil {
			return usage.Wrap(err)
		}
		if *measured != "" {
			m, err := twin.LoadMeasurements(*measured)
			if err != nil {
				return usage.Errorf("--measured: %v", err)
			}
			if p, err = twin.ProfileFromMeasurements(p, m); err != nil {
				return usage.Errorf("--measured %s: %v", *measured, err)
			}
		}
		return p.WriteJSON(stdout)
	}
	if fs.NArg() == 0 {
		return usage.Errorf("--fit needs the iteration logs of a run (e.g. 'DIR/iter.{rank}.jsonl')")
	}
	files, err := report.ExpandLogPaths(fs.Args())
	if err != nil {
		return usage.Wrap(err)
	}
	m, err := twin.BuiltinModel(*model)
	if err != nil {
		return usage.Wrap(err)
	}
	p, st, err := fitLinearProfile(files, m)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "fit: %d steps from %d files; per-step error: mean %.1f%%, p90 %.1f%%; host %.3f ms per iteration\n",
		st.samples, len(files), 100*st.meanAbsErr, 100*st.p90AbsErr, p.HostOverheadMS.Value)
	return p.WriteJSON(stdout)
}

// fitStats describes a linear fit: steps used and the in-sample relative
// error of the fitted step times.
type fitStats struct {
	samples                 int
	meanAbsErr, p90AbsErr   float64
	hostMedianMS            float64
	coefficients            twin.LinearCoefficients
	measuredMS, predictedMS []float64
}

// fitLinearProfile fits the linear cost model of docs/twin.md to every step
// the logs record (an iteration with a forward and a measured device time):
// features from the record (new tokens, Σ n·(kv + n/2) of the context
// chunks, Σ KV of the decodes, sequences; an attention-DP dummy counts as a
// one-token decode at depth 0), the measured device_ms as the target (less
// moe_wait_ms for a MoE model under expert parallelism: compute). The
// host time per iteration is the median of host_ms − device_ms − wait_ms
// (the loop's own work: scheduling, step building, result application).
func fitLinearProfile(files []string, m twin.Model) (*twin.Profile, fitStats, error) {
	var samples []twin.LinearSample
	var hosts []float64
	err := report.ScanIterLogs(files, func(path string, line int, text []byte) error {
		l, keys, err := report.DecodeIterRecord(text)
		if err != nil || !keys.Iter {
			return fmt.Errorf("%s:%d: not an iteration-log record (written by --iter-log)", path, line)
		}
		if l.DeviceMS == nil || *l.DeviceMS <= 0 {
			return nil
		}
		if !keys.GenKVTokens {
			return fmt.Errorf("%s:%d: the record has no gen_kv_tokens (a log of an older worker): rerun with this one", path, line)
		}
		// A MoE rank's own cost is its compute: the time it waited in
		// MoE exchanges belongs to the slowest rank (the twin's fleet
		// step, the max over ranks, adds it back).
		compute := *l.DeviceMS
		if l.MoEWaitMS != nil {
			compute -= *l.MoEWaitMS
		}
		if compute <= 0 {
			return nil
		}
		s := twin.LinearSample{Tokens: float64(l.CtxTokens + l.GenTokens), CtxWork: l.CostS,
			DecodeKV: float64(l.GenKVTokens), Seqs: float64(l.NumCtxRequests + l.NumGenRequests), MS: compute}
		if l.ADPDummy {
			s.Tokens++
			s.DecodeKV++
			s.Seqs++
		}
		samples = append(samples, s)
		hosts = append(hosts, max(0, l.HostMS-*l.DeviceMS-l.WaitMS))
		return nil
	})
	if err != nil {
		return nil, fitStats{}, err
	}
	if len(samples) < 10 {
		return nil, fitStats{}, fmt.Errorf("the logs hold %d steps with a device time; a fit needs at least 10", len(samples))
	}
	c, err := twin.FitLinear(samples)
	if err != nil {
		return nil, fitStats{}, fmt.Errorf("linear fit: %w", err)
	}
	st := fitStats{samples: len(samples), coefficients: c}
	errs := make([]float64, len(samples))
	for i, s := range samples {
		pred := c.Predict(s)
		st.measuredMS = append(st.measuredMS, s.MS)
		st.predictedMS = append(st.predictedMS, pred)
		errs[i] = math.Abs(pred-s.MS) / s.MS
		st.meanAbsErr += errs[i] / float64(len(errs))
	}
	slices.Sort(errs)
	st.p90AbsErr = errs[min(len(errs)-1, len(errs)*9/10)]
	slices.Sort(hosts)
	st.hostMedianMS = hosts[len(hosts)/2]
	p, err := twin.NewLinearProfile(m, c, fmt.Sprintf("fitted by worker twin-profile --fit to %d steps of %s", len(samples), strings.Join(files, ", ")))
	if err != nil {
		return nil, fitStats{}, err
	}
	p.HostOverheadMS = twin.Coef{Value: math.Round(st.hostMedianMS*1000) / 1000,
		Source: "median host time per iteration (host_ms − device_ms − wait_ms) of the fitted logs"}
	if err := p.Validate(); err != nil {
		return nil, fitStats{}, err
	}
	return p, st, nil
}

// validateTwin checks the twin's settings and builds its cost profile; with
// --pages 0 it sizes the pool from the profile's GPU memory here, the same
// for every rank of every process. Other engines refuse the twin's flags.
func (o *serveOptions) validateTwin() error {
	if o.engine != "twin" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"gpu", o.gpu != "h200"}, {"cost-profile", o.costProfile != ""}, {"tp", o.tp != 1}} {
			if f.set {
				return usage.Errorf("%s is a setting of the digital twin: it needs --engine twin (got %s %s)",
					o.src(f.name), o.src("engine"), o.engine)
			}
		}
		return nil
	}
	if o.tp < 1 {
		return usage.Errorf("%s must be at least 1, got %d", o.src("tp"), o.tp)
	}
	if o.cp > 1 {
		return usage.Errorf("%s %d with --engine twin: the twin models attention-DP ranks only (no Helix)", o.src("cp"), o.cp)
	}
	p, err := o.twinProfile()
	if err != nil {
		return err
	}
	o.profile = p
	if o.pages == 0 {
		if o.pages, err = twinPoolPages(p, o.tokensPerPage); err != nil {
			return err
		}
	}
	return nil
}

// replayStart is the instant a trace replay starts from: now on a wall
// clock, the twin's epoch on its virtual clock.
func (o *serveOptions) replayStart(now time.Time) time.Time {
	if o.engine == "twin" {
		return twinEpoch
	}
	return now
}

// calibSettings are the online calibrator's settings from the config file
// (scheduler.ctx_cost.*), with the defaults of §9.1. The lockstep
// correction is on by default: with one rank it changes nothing (§10.2).
type calibSettings struct {
	percentile, hysteresis      float64
	minSamples, window, refresh int
	correction                  bool
}

func defaultCalibSettings() calibSettings {
	return calibSettings{percentile: costfit.DefaultOnlinePercentile, hysteresis: costfit.DefaultHysteresis,
		minSamples: costfit.DefaultMinSamples, window: costfit.DefaultWindow, refresh: costfit.DefaultRefreshInterval,
		correction: true}
}

// settings resolves the calibrator's settings for a token budget m.
func (c calibSettings) settings(m int64) costfit.Settings {
	s := costfit.DefaultSettings(m)
	s.Percentile, s.Hysteresis = c.percentile, c.hysteresis
	s.MinSamples, s.Window, s.RefreshInterval = c.minSamples, c.window, c.refresh
	s.LockstepCorrection = c.correction
	return s
}

// validateCtxCost checks --ctx-cost and, in auto mode, that equal-cost
// chunking can act (chunked prefill and a finite token budget) and that the
// calibrator's settings are valid, naming where each came from.
func (o *serveOptions) validateCtxCost() error {
	mode, err := scheduler.ParseCostMode(o.ctxCost)
	if err != nil {
		return usage.Errorf("%s %q is not allowed (allowed: off, manual, auto)", o.src("ctx-cost"), o.ctxCost)
	}
	if mode != scheduler.CostAuto {
		return nil
	}
	switch {
	case !o.chunked:
		return usage.Errorf("%s auto needs chunked prefill (%s is off): equal-cost chunking caps chunks", o.src("ctx-cost"), o.src("chunked-prefill"))
	case o.maxNumTokens == 0:
		return usage.Errorf("%s auto needs a token budget (%s is 0, unlimited): the calibrator fits full-budget iterations",
			o.src("ctx-cost"), o.src("max-num-tokens"))
	}
	if _, err := costfit.New(o.calib.settings(int64(o.maxNumTokens))); err != nil {
		return usage.Errorf("scheduler.ctx_cost in %s: %v", o.configPath, err)
	}
	return nil
}
