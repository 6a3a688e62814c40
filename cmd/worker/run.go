package main

import (
	"io"
	"os"

	"github.com/lockstep-ai/lockstep/fleet"
)

// runServe is `worker run`: the fleet's flags and config file, the run on
// this process's ranks, and rank 0's report.
func runServe(args []string, stdout, stderr io.Writer) error {
	o, err := fleet.ParseArgs(args, stderr)
	if err != nil {
		return err
	}
	o.GPUFreeMemory = gpuFreeMemory
	out, err := fleet.Run(o, stderr, os.Getenv)
	if err != nil || out == nil {
		return err // out == nil: not rank 0, which prints the report
	}
	return out.Print(stdout, o.Report)
}
