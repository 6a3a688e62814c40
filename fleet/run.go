package fleet

import (
	"errors"
	"fmt"
	"github.com/lockstep-ai/lockstep/bridge"
	"io"
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// Outcome is a finished run as rank 0's process sees it.
type Outcome struct {
	Report *report.Report
	Result Result
	Reqs   []workload.Request
	// OutErr is the first error of an output file: the run itself
	// succeeded, the file is incomplete.
	OutErr error
}

// Result is what the ranks produced, as seen from rank 0.
type Result struct {
	Rank0    *executor.Result
	Wall     time.Duration
	DeviceMS []float64 // per rank
}

// Print prints the report in format (text or json; a prompt run's
// completions come first in text). The report is printed even when an
// output failed, since the results exist; then an incomplete output, a
// request never answered, and a run in which nothing was served, are errors.
func (out *Outcome) Print(w io.Writer, format string) error {
	var err error
	if format == "json" {
		err = out.Report.WriteJSON(w)
	} else {
		if out.Report.Outputs != nil {
			err = report.WritePromptOutputs(w, out.Report.Outputs)
		}
		err = errors.Join(err, out.Report.WriteText(w))
	}
	if out.OutErr != nil {
		return errors.Join(err, fmt.Errorf("the run finished (report printed) but an output is incomplete: %w", out.OutErr))
	}
	if err != nil {
		return err
	}
	if err := out.Report.Unanswered(); err != nil {
		return err
	}
	return out.Report.NothingServed()
}

// Run runs validated options: scheduler configuration (getenv supplies
// the TLLM_* variables), startup checks, outputs, workload, the ranks, the
// report. It returns nil, nil on a process that is not rank 0.
func Run(o *Options, stderr io.Writer, getenv func(string) string) (*Outcome, error) {
	log, err := newLogger(stderr, o.LogLevel)
	if err != nil {
		return nil, err
	}
	defer log.Sync() //nolint:errcheck
	sc, launch, err := o.prepare(log, getenv)
	if err != nil {
		return nil, err
	}
	if o.loaded != nil {
		defer o.loaded.Close() //nolint:errcheck // read-only mapping
	}
	for _, w := range []string{o.adpConfigWarning(o.AttentionDPRanks(launch)), o.routerConfigWarning()} {
		if w != "" {
			log.Warn(w)
		}
	}
	// The workload is read and judged before any output is opened: a run
	// refused for its trace leaves the files of an earlier run as they
	// were. A server's requests come over HTTP: no workload (the built-in
	// sample is `worker run`'s default).
	var reqs []workload.Request
	if o.API == nil {
		if reqs, err = o.LoadWorkload(o.AttentionDPRanks(launch)); err != nil {
			return nil, err
		}
	}
	if err := o.checkServable(sc, reqs); err != nil {
		return nil, err
	}
	if o.out, err = o.openOutputs(launch, log, getenv); err != nil {
		return nil, err
	}
	defer o.out.close() //nolint:errcheck // closed again below, where its errors are reported
	var res *Result
	if launch.MultiProcess() {
		res, err = runProcess(o, sc, reqs, launch, log, stderr, getenv)
	} else {
		res, err = runInProcess(o, sc, reqs, log, stderr, getenv)
	}
	if err != nil {
		return nil, err
	}
	if w := o.fault.unfiredWarning(); w != "" {
		log.Warn(w)
	}
	if res == nil {
		return nil, o.out.close() // not rank 0: rank 0 prints the report
	}
	rep := report.Build(o.runInfo(res, launch), reqs, res.Rank0)
	if w := o.out.requestsWriter(); w != nil {
		report.WriteRequests(w, reqs, res.Rank0.Responses) //nolint:errcheck // an output keeps its first error for close
	}
	return &Outcome{Report: rep, Result: *res, Reqs: reqs, OutErr: o.out.close()}, nil
}

// prepare builds the scheduler configuration, detects the launch and runs
// the startup checks, logging their notes and the model.
func (o *Options) prepare(log *zap.Logger, getenv func(string) string) (scheduler.Config, nccl.Launch, error) {
	sc, notes, err := o.SchedulerConfig(getenv)
	if err != nil {
		return sc, nccl.Launch{}, usage.Wrap(err)
	}
	launch, err := nccl.DetectLaunch(getenv)
	if err != nil {
		return sc, launch, usage.Wrap(err)
	}
	more, err := o.startupChecks(sc, launch, getenv)
	if err != nil {
		return sc, launch, err
	}
	o.cpuThreads = o.resolveCPUThreads(launch, runtime.GOMAXPROCS(0))
	for _, n := range append(notes, more...) {
		log.Info(n)
	}
	if m := o.loaded; m != nil {
		log.Info("model", zap.String("path", m.Path), zap.String("name", m.Name),
			zap.String("format", m.Format), zap.Int64("weight_bytes", m.WeightBytes()), zap.Any("shape", m.Shape))
	}
	if o.Engine == "cpu" && o.CPUKernels == "quant" && !o.hasQuantisedProjections() {
		log.Info("cpu kernels: the model has no Q8_0, Q4_0 or Q4_1 projection to keep in blocks; every product stays exact",
			zap.String("model", o.Model))
	}
	return sc, launch, nil
}

// hasQuantisedProjections reports whether the loaded checkpoint gives a
// dense projection or the LM head as Q8_0, Q4_0 or Q4_1 blocks, which
// --cpu-kernels quant keeps quantised (a synthetic preset gives none).
func (o *Options) hasQuantisedProjections() bool {
	if o.loaded == nil {
		return false
	}
	for _, t := range o.loaded.Tensors {
		switch t.DType {
		case bridge.DTypeQ8_0, bridge.DTypeQ4_0, bridge.DTypeQ4_1:
		default:
			continue
		}
		switch t.Kind {
		case bridge.WeightQ, bridge.WeightK, bridge.WeightV, bridge.WeightO, bridge.WeightGate, bridge.WeightUp,
			bridge.WeightDown, bridge.WeightLMHead, bridge.WeightEmbedding:
			return true
		}
	}
	return false
}

// MaxCPUThreads is the most threads a rank's CPU engine may use (--cpu-threads).
const MaxCPUThreads = 1024

// ranksHere is how many ranks compute on this machine's cores: this
// process's, or the launcher's processes on the node.
func (o *Options) ranksHere(launch nccl.Launch) int {
	if launch.MultiProcess() {
		return max(launch.LocalSize, 1)
	}
	return o.world()
}

// resolveCPUThreads is --cpu-threads, or for 0 the cores this process may use
// (GOMAXPROCS: CPU affinity and cgroup quota) shared by the ranks computing
// on them, at least 1. Only the CPU engine uses it.
func (o *Options) resolveCPUThreads(launch nccl.Launch, cores int) int {
	if o.CPUThreads > 0 {
		return o.CPUThreads
	}
	return max(1, cores/o.ranksHere(launch))
}

// runInfo is what the report says about the run besides its requests.
func (o *Options) runInfo(res *Result, launch nccl.Launch) report.RunInfo {
	info := report.RunInfo{Engine: o.Engine, Model: o.Model, Ranks: o.Ranks, Wall: res.Wall, DeviceMSPerRank: res.DeviceMS,
		MoE: o.moe() && o.Engine != "twin"}
	if o.loaded != nil {
		info.Model = o.loaded.Name
		if o.Text.Active() {
			info.Outputs = o.promptOutputs(res)
		}
	}
	if o.Engine == "cpu" {
		// The ranks that computed on this node's cores: this process's, or
		// the launcher's processes on the node. GOMAXPROCS is the cores the
		// process may use (CPU affinity and cgroup quota).
		info.RanksHere, info.Cores, info.ThreadsPerRank = o.ranksHere(launch), runtime.GOMAXPROCS(0), o.cpuThreads
	}
	if o.Engine == "twin" {
		info.Model, info.VirtualEpoch = o.profile.Model.Name, twinEpoch
		if o.profile.Kind == twin.KindRoofline {
			info.GPU = o.profile.GPU.Name
		}
	}
	return info
}
