//go:build native

package native

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestRunOnEngineThread: inside RunOnEngineThread the function runs on the
// engine's thread, its engine calls run there in place (the same results as
// handed-off calls), a call from another goroutine waits until it returns,
// Close is refused from inside and a nested call runs in place.
func TestRunOnEngineThread(t *testing.T) {
	eng := openTiny(t, 8, 0)
	e := eng.(*engine)
	desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(3, 9, 512), BlockTable: pageRange(0, 2), Sample: true}}}
	var want bridge.StepResult
	if err := eng.Step(desc, &want); err != nil {
		t.Fatal(err)
	}
	outside := make(chan time.Time, 1)
	var inside time.Time
	err := e.RunOnEngineThread(func() error {
		if got := syscall.Gettid(); got != e.tid {
			t.Errorf("fn runs on thread %d, the engine's is %d", got, e.tid)
		}
		// Another goroutine's call is handed over and waits for fn.
		go func() {
			_ = e.NativeCPU()
			outside <- time.Now()
		}()
		var res bridge.StepResult
		if err := eng.Step(desc, &res); err != nil {
			return err
		}
		if res.Sampled[0] != want.Sampled[0] {
			t.Errorf("inline Step sampled %d, the handed-off one %d", res.Sampled[0], want.Sampled[0])
		}
		if err := eng.Submit(desc); err != nil {
			return err
		}
		if err := eng.Wait(&res); err != nil {
			return err
		}
		if res.Sampled[0] != want.Sampled[0] {
			t.Errorf("inline Submit/Wait sampled %d, want %d", res.Sampled[0], want.Sampled[0])
		}
		if err := eng.Close(); !errors.Is(err, bridge.ErrInvalidArgument) {
			t.Errorf("Close inside RunOnEngineThread: %v, want INVALID_ARGUMENT", err)
		}
		nested := false
		if err := e.RunOnEngineThread(func() error { nested = true; return nil }); err != nil || !nested {
			t.Errorf("nested RunOnEngineThread: ran %v, err %v", nested, err)
		}
		time.Sleep(20 * time.Millisecond)
		inside = time.Now()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-outside; got.Before(inside) {
		t.Error("a call from another goroutine ran while RunOnEngineThread's function held the engine")
	}
	if e.inline() {
		t.Error("the engine still runs calls in place after RunOnEngineThread returned")
	}
	fail := errors.New("loop failed")
	if err := e.RunOnEngineThread(func() error { return fail }); !errors.Is(err, fail) {
		t.Errorf("RunOnEngineThread returned %v, want fn's error", err)
	}
}

// TestInlineCallsAllocateNothing: a loop on the engine thread steps, submits
// and waits without allocating (issue 24: no allocation per iteration).
func TestInlineCallsAllocateNothing(t *testing.T) {
	eng := openTiny(t, 8, 0)
	e := eng.(*engine)
	desc := &bridge.StepDesc{Seqs: []bridge.SeqStep{{Tokens: prompt(1, 9, 512), BlockTable: pageRange(0, 2), Sample: true}}}
	var res bridge.StepResult
	err := e.RunOnEngineThread(func() error {
		if err := eng.Step(desc, &res); err != nil {
			return err
		}
		var callErr error
		allocs := testing.AllocsPerRun(20, func() {
			for _, err := range []error{eng.Step(desc, &res), eng.Submit(desc), eng.Wait(&res)} {
				if err != nil && callErr == nil {
					callErr = err
				}
			}
			_ = e.NativeCPU()
		})
		if allocs > 0 {
			t.Errorf("inline Step, Submit and Wait allocate %.1f times per round", allocs)
		}
		return callErr
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunOnEngineThreadAfterClose fails with ErrClosed.
func TestRunOnEngineThreadAfterClose(t *testing.T) {
	eng, err := Open(bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := eng.(bridge.ThreadOwner).RunOnEngineThread(func() error { ran = true; return nil }); !errors.Is(err, bridge.ErrClosed) || ran {
		t.Errorf("after Close: ran %v, err %v; want ErrClosed", ran, err)
	}
}

// TestCPUKernelsRefused: an unknown kernel set is refused naming the field
// and what is allowed, before any native work.
func TestCPUKernelsRefused(t *testing.T) {
	_, err := Open(bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4, CPUKernels: "fast"})
	if !errors.Is(err, bridge.ErrInvalidArgument) || err == nil ||
		!strings.Contains(err.Error(), `Config.CPUKernels "fast" is not a CPU kernel set (allowed: exact, quant)`) {
		t.Fatalf("CPUKernels fast: %v", err)
	}
	eng, err := Open(bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4, CPUKernels: "quant"})
	if err != nil {
		t.Fatalf("quant kernels on synthetic weights (run exactly): %v", err)
	}
	eng.Close()
}
