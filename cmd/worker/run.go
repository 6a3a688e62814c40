package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"

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
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.MemProfile != "" {
		f, err := os.Create(o.MemProfile)
		if err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		defer f.Close()
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintf(stderr, "--memprofile: %v\n", err)
			}
		}()
	}
	out, err := fleet.Run(o, stderr, os.Getenv)
	if err != nil || out == nil {
		return err // out == nil: not rank 0, which prints the report
	}
	return out.Print(stdout, o.Report)
}
