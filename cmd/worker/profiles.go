package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/nccl"
)

// profilePath is where this process writes a profile given as path: "{rank}"
// becomes the launch's rank; without it, under a launch of several
// processes, rank 0 alone writes it ("" for the others), since every
// process would otherwise truncate the same file.
func profilePath(path string, l nccl.Launch) string {
	if strings.Contains(path, "{rank}") {
		return strings.ReplaceAll(path, "{rank}", strconv.Itoa(l.Rank))
	}
	if l.MultiProcess() && l.Rank != 0 {
		return ""
	}
	return path
}

// startProfiles starts what --cpuprofile and --memprofile ask of this
// process (`worker run` and `worker serve` alike). stop ends the CPU
// profile and writes the allocation profile after a collection, so that
// its in-use figures are the heap as the command ends; it reports a
// failure to write on stderr.
func startProfiles(o *fleet.Options, l nccl.Launch, stderr io.Writer) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if path := profilePath(o.CPUProfile, l); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return stop, fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return stop, fmt.Errorf("--cpuprofile: %w", err)
		}
		stops = append(stops, func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
	if path := profilePath(o.MemProfile, l); path != "" {
		f, err := os.Create(path)
		if err != nil {
			stop()
			return func() {}, fmt.Errorf("--memprofile: %w", err)
		}
		stops = append(stops, func() {
			runtime.GC()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintf(stderr, "--memprofile: %v\n", err)
			}
			f.Close()
		})
	}
	return stop, nil
}
