// Package cputime reads the calling thread's CPU clock, for benchmarks and
// the executor's host-time measurements: on a shared machine wall time
// counts whatever else runs, the thread's CPU time only what this thread
// did (user and system time, GC assists included).
//
// A goroutine may move between threads; a measured span must run locked to
// its thread (runtime.LockOSThread) for the difference of two readings to
// mean anything. Span does that for a function.
package cputime

import (
	"runtime"
	"time"
)

// Thread returns the calling thread's CPU time and true, or 0 and false
// where the platform has no per-thread CPU clock (then callers fall back to
// wall time and say so).
func Thread() (time.Duration, bool) { return threadCPU() }

// Available reports whether Thread reads a per-thread CPU clock here.
func Available() bool {
	_, ok := threadCPU()
	return ok
}

// Span runs f locked to its thread and returns the thread CPU time f took,
// or its wall time where no thread clock exists (ok false).
func Span(f func()) (d time.Duration, ok bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0, ok := threadCPU()
	if !ok {
		w := time.Now()
		f()
		return time.Since(w), false
	}
	f()
	t1, _ := threadCPU()
	return t1 - t0, true
}

// Process returns the CPU time of the whole process so far (every thread:
// user and system time, the Go runtime's and the garbage collector's
// included) and true, or 0 and false where it cannot be read.
func Process() (time.Duration, bool) { return processCPU() }
