package cputime

import (
	"testing"
	"time"
)

// A busy loop costs CPU time; a sleep costs (nearly) none.
func TestSpanCountsCPUNotSleep(t *testing.T) {
	if !Available() {
		t.Skip("no per-thread CPU clock on this platform")
	}
	busy, ok := Span(func() {
		deadline := time.Now().Add(20 * time.Millisecond)
		x := 0
		for time.Now().Before(deadline) {
			x++
		}
		_ = x
	})
	if !ok || busy <= 0 {
		t.Fatalf("busy span: %v, %v", busy, ok)
	}
	idle, _ := Span(func() { time.Sleep(50 * time.Millisecond) })
	if idle >= 25*time.Millisecond {
		t.Fatalf("a 50 ms sleep cost %v of thread CPU time (expected far less)", idle)
	}
	if idle >= busy+10*time.Millisecond {
		t.Fatalf("sleep (%v) cost more CPU than a busy loop (%v)", idle, busy)
	}
}

// The process clock counts a busy loop and never runs backwards.
func TestProcessCountsCPU(t *testing.T) {
	t0, ok := Process()
	if !ok {
		t.Skip("no process CPU clock on this platform")
	}
	deadline := time.Now().Add(20 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	t1, _ := Process()
	if t1-t0 < 5*time.Millisecond {
		t.Fatalf("a 20 ms busy loop cost %v of process CPU time", t1-t0)
	}
}
