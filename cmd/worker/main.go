// Command worker is the lockstep serving worker: one process per GPU (or
// several in-process ranks), driving a native engine through the cgo bridge.
// This package is command wiring only: each command parses its flags,
// calls the packages that do the work, and prints.
//
//	worker run           serve a trace, prompts or the built-in sample on the
//	                     fleet's ranks and print a report (fleet, report)
//	worker serve         an OpenAI-compatible HTTP API on rank 0 of the same
//	                     fleet (fleet, serve)
//	worker schedule      dry-run the scheduler on a scenario file
//	                     (scheduler/sim/scenario)
//	worker calibrate     fit kv_cost_offset and kv_depth_threshold from
//	                     iteration logs (report, scheduler/costfit)
//	worker eval          the equal-cost, demotion and online-calibrator
//	                     configurations side by side on the twin (eval)
//	worker twin-profile  print the twin's cost profile of a GPU and model, or
//	                     fit one to iteration logs (bridge/twin, fleet)
//	worker twin-validate run the twin on the published GPU figures it is
//	                     checked against and print twin/published (eval/twinval)
//	worker loadgen       replay a trace or prompts against an OpenAI-compatible
//	                     server and report latencies (serve/loadgen)
//	worker info          print the engine backends this build supports, or
//	                     describe a checkpoint (model)
//	worker help          print the usage
//
// GPU discovery (go-nvml) lives here and is injected into the fleet.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/lockstep-ai/lockstep/internal/usage"
)

const usageText = `usage: worker <command> [flags]

commands:
  run        serve a trace (default: a built-in sample) on lockstep ranks and print a report
  serve      an OpenAI-compatible HTTP API on rank 0 of the same fleet (docs/serving.md)
  schedule   dry-run the scheduler on a scenario file (--scenario FILE.json)
  calibrate  fit kv_cost_offset and kv_depth_threshold from iteration logs (docs/calibration.md)
  eval       run the equal-cost / demotion / online-calibrator configurations side by side on the twin (docs/eval.md)
  twin-profile  print the digital twin's cost profile of a GPU and model, or fit one to iteration logs (docs/twin.md)
  twin-validate  run the twin on published GPU figures (TensorRT-LLM, NIM, Vidur, DeepGEMM, NVFP4 GEMMs) and print twin/published (docs/twin.md)
  loadgen    replay a trace or prompts against an OpenAI-compatible server and report latencies (docs/loadgen.md)
  info       print the engine backends this build supports
  help       print this text

Run "worker <command> -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runServe(args[1:], stdout, stderr)
	case "serve":
		err = runAPIServe(args[1:], stdout, stderr)
	case "schedule":
		err = runSchedule(args[1:], stdout, stderr)
	case "calibrate":
		err = runCalibrate(args[1:], stdout, stderr)
	case "eval":
		err = runEval(args[1:], stdout, stderr)
	case "twin-profile":
		err = runTwinProfile(args[1:], stdout, stderr)
	case "twin-validate":
		err = runTwinValidate(args[1:], stdout, stderr)
	case "loadgen":
		err = runLoadgen(args[1:], stdout, stderr)
	case "info":
		err = runInfo(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "worker: unknown command %q (allowed: run, serve, schedule, calibrate, eval, twin-profile, twin-validate, loadgen, info, help)\n", args[0])
		return 2
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if usage.Is(err) {
		fmt.Fprintf(stderr, "worker %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "worker %s: %v\n", args[0], err)
	return 1
}
