//go:build native

package native

import (
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/internal/cputime"
)

// The engine's own thread: every native call on a handle runs on one
// goroutine locked to its OS thread (doc.go), handed over by call, or in
// place for a loop that runs on that goroutine (RunOnEngineThread); and
// the thread's CPU clocks.

// loop runs requests on one OS thread for the engine's lifetime. The thread
// stays locked when the goroutine exits, so Go destroys it rather than reuse
// a thread that carries native per-thread state (e.g. a CUDA context).
func (e *engine) loop() {
	runtime.LockOSThread()
	e.tid = syscall.Gettid() // before the first receive: every caller sees it
	for fn := range e.reqs {
		fn()
		e.done <- struct{}{}
	}
}

// run executes fn on the engine goroutine and waits for it. Caller holds no
// lock; run takes e.mu so requests never interleave.
func (e *engine) run(fn func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reqs <- fn
	<-e.done
}

// inline reports whether the caller is the engine goroutine running
// RunOnEngineThread's function: then calls run in place (the goroutine is
// locked to the engine thread, so the thread id names it). Any other caller
// hands its call over and waits for e.mu, which the owning call holds.
func (e *engine) inline() bool {
	return e.owned.Load() && syscall.Gettid() == e.tid
}

// RunOnEngineThread implements bridge.ThreadOwner: fn runs on the engine
// thread, and the engine calls it makes run there without a hand-off. A
// call from inside fn runs fn in place.
func (e *engine) RunOnEngineThread(fn func() error) error {
	if e.inline() {
		return fn()
	}
	var err error
	if cerr := e.call("run_on_engine_thread", func() {
		e.owned.Store(true)
		defer e.owned.Store(false)
		err = fn()
	}); cerr != nil {
		return cerr
	}
	return err
}

// call is run for an open engine: it fails with bridge.ErrClosed after
// Close. On the engine thread inside RunOnEngineThread it runs fn in place
// (the engine cannot be closed meanwhile: Close waits for e.mu).
func (e *engine) call(op string, fn func()) error {
	if e.inline() {
		fn()
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("engine %s: %w", op, bridge.ErrClosed)
	}
	e.reqs <- fn
	<-e.done
	return nil
}

// NativeCPU is the engine thread's CPU time spent in the native step calls
// so far: on the CPU engine, the compute (a benchmark subtracts it from the
// process's CPU time to get the host's). It is 0 where the platform has no
// per-thread CPU clock.
func (e *engine) NativeCPU() time.Duration {
	if e.inline() {
		return e.nativeCPU
	}
	var d time.Duration
	if err := e.call("native_cpu", func() { d = e.nativeCPU }); err != nil {
		return 0
	}
	return d
}

// ThreadCPU is the engine thread's whole CPU time so far: its native calls
// (NativeCPU) and, while a loop runs on the thread (RunOnEngineThread), that
// loop's. A benchmark takes the difference of the two as the loop's host
// time on the critical path. 0 where the platform has no thread CPU clock.
func (e *engine) ThreadCPU() time.Duration {
	var d time.Duration
	if err := e.call("thread_cpu", func() { d, _ = cputime.Thread() }); err != nil {
		return 0
	}
	return d
}
