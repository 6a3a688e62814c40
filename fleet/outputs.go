package fleet

// The files `worker run` writes: --requests-out, --iter-log and
// --kv-events. They are created before any work starts, so that a path that
// cannot be written fails the run at once, naming the flag and the path,
// instead of after the results exist. A write that fails later (a full
// disk) does not stop serving either: the file keeps its first error, the
// run finishes, the report is printed, and only then does the worker exit
// non-zero naming the flag and the path.

import (
	"errors"
	"io"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/nccl"
)

// outputFiles are this process's outputs.
type outputFiles struct {
	requests *report.OutputFile   // --requests-out; nil when unset or not rank 0's process
	events   *report.OutputFile   // --kv-events; nil when unset or not rank 0's process
	iterLogs []*report.OutputFile // --iter-log per rank; nil for ranks not logged here
	all      []*report.OutputFile
}

// openOutputs creates this process's outputs for a world of world ranks.
// only is the process's rank under a launcher (one rank per process), or
// -1 when every rank runs in this process. Rank 0's process writes the
// requests and the event stream. warn reports one-off warnings (ignored
// TLLM_PROFILE_LOG_RANKS entries, a write that failed during the run).
func openOutputs(o *Options, world, only int, logRanks string, warn func(string)) (*outputFiles, error) {
	outs := &outputFiles{iterLogs: make([]*report.OutputFile, world)}
	onFail := func(err error) { warn(err.Error() + "; the run goes on, the file is incomplete") }
	open := func(flag, path string, allowStderr bool) (*report.OutputFile, error) {
		f, err := report.CreateOutput(flag, path, allowStderr, onFail)
		if err != nil {
			outs.close() //nolint:errcheck // the open error is the one to report
			return nil, usage.Wrap(err)
		}
		outs.all = append(outs.all, f)
		return f, nil
	}
	var err error
	if o.RequestsOut != "" && only <= 0 {
		if outs.requests, err = open("--requests-out", o.RequestsOut, false); err != nil {
			return nil, err
		}
	}
	if o.KVEvents != "" && only <= 0 {
		if outs.events, err = open("--kv-events", o.KVEvents, false); err != nil {
			return nil, err
		}
	}
	if o.IterLog == "" {
		return outs, nil
	}
	chosen, w := selectLogRanks(logRanks, world)
	if w != "" {
		warn(w)
	}
	paths, err := iterLogPaths(o.IterLog, chosen, only)
	if err != nil {
		return nil, usage.Wrap(err)
	}
	byPath := map[string]*report.OutputFile{}
	for r, p := range paths {
		if p == "" {
			continue
		}
		if f, ok := byPath[p]; ok { // ranks sharing a path share the file
			outs.iterLogs[r] = f
			continue
		}
		f, err := open("--iter-log", p, true)
		if err != nil {
			return nil, err
		}
		byPath[p] = f
		outs.iterLogs[r] = f
	}
	return outs, nil
}

// iterLog is rank's iteration log writer, nil (a nil interface, which the
// executor reads as "no log") when the rank is not logged here.
func (s *outputFiles) iterLog(rank int) io.Writer {
	if s == nil || rank < 0 || rank >= len(s.iterLogs) || s.iterLogs[rank] == nil {
		return nil
	}
	return s.iterLogs[rank]
}

// eventSink is rank 0's KV event writer (nil elsewhere: only rank 0 writes).
func (s *outputFiles) eventSink(rank int) io.Writer {
	if s == nil || rank != 0 || s.events == nil {
		return nil
	}
	return s.events
}

// requestsWriter is the --requests-out writer, nil when there is none.
func (s *outputFiles) requestsWriter() io.Writer {
	if s == nil || s.requests == nil {
		return nil
	}
	return s.requests
}

// close closes every file and returns their errors, joined.
func (s *outputFiles) close() error {
	if s == nil {
		return nil
	}
	var errs []error
	for _, f := range s.all {
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openOutputs opens o's outputs for this process under launch l: every
// rank's in-process, or the launcher's rank alone.
func (o *Options) openOutputs(l nccl.Launch, log *zap.Logger, getenv func(string) string) (*outputFiles, error) {
	world, only := o.world(), -1
	if l.MultiProcess() {
		world, only = l.WorldSize, l.Rank
	}
	return openOutputs(o, world, only, getenv("TLLM_PROFILE_LOG_RANKS"), func(w string) { log.Warn(w) })
}
