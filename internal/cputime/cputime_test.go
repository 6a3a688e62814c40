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
