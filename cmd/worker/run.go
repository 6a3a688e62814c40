package main

import (
	"io"
	"os"

	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/nccl"
)

// runServe is `worker run`: the fleet's flags and config file, the run on
// this process's ranks, and rank 0's report.
func runServe(args []string, stdout, stderr io.Writer) error {
	o, err := fleet.ParseArgs(args, stderr)
	if err != nil {
		return err
	}
	o.GPUFreeMemory = gpuFreeMemory
	// A launch environment fleet.Run refuses is refused there, with its
	// message; the profiles take it as one process until then.
	launch, _ := nccl.DetectLaunch(os.Getenv)
	stop, err := startProfiles(o, launch, stderr)
	if err != nil {
		return err
	}
	defer stop()
	out, err := fleet.Run(o, stderr, os.Getenv)
	if err != nil || out == nil {
		return err // out == nil: not rank 0, which prints the report
	}
	return out.Print(stdout, o.Report)
}
