package goengine

import (
	"errors"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

func wantInvalid(t *testing.T, err error, op, msg string) {
	t.Helper()
	var e *bridge.Error
	if !errors.As(err, &e) || !errors.Is(err, bridge.ErrInvalidArgument) || e.Op != op || e.Msg != msg {
		t.Errorf("%v, want INVALID_ARGUMENT of %s: %q", err, op, msg)
	}
}

// TestQueueOrderAndLimits: results come back in submit order, at most
// bridge.MaxInflight are outstanding, and the refusals carry the native
// engine's messages.
func TestQueueOrderAndLimits(t *testing.T) {
	var q Queue[int]
	if err := q.RequireIdle("step"); err != nil {
		t.Fatal(err)
	}
	_, err := q.Pop("wait")
	wantInvalid(t, err, "wait", "no submitted step to wait for")
	next := 0
	for round := range 3 { // wraps the ring
		for range bridge.MaxInflight {
			s, err := q.Next("submit")
			if err != nil {
				t.Fatal(err)
			}
			next++
			*s = next
			q.Push()
		}
		_, err := q.Next("submit")
		wantInvalid(t, err, "submit", "2 steps are already in flight")
		wantInvalid(t, q.RequireIdle("step"), "step", "2 submitted steps have not been waited for")
		for k := range bridge.MaxInflight {
			s, err := q.Pop("wait")
			if want := round*bridge.MaxInflight + k + 1; err != nil || *s != want {
				t.Fatalf("round %d: Pop = %v, %v; want %d", round, *s, err, want)
			}
		}
		if q.Len() != 0 {
			t.Fatalf("Len = %d after draining", q.Len())
		}
	}
	// A step that fails after Next is never queued.
	if _, err := q.Next("submit"); err != nil || q.Len() != 0 {
		t.Errorf("Next queued a slot: %v, Len %d", err, q.Len())
	}
}

func TestQueuePushWithoutNextPanics(t *testing.T) {
	var q Queue[int]
	for range bridge.MaxInflight {
		q.Push()
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "Push on a full queue") {
			t.Errorf("recover() = %v", r)
		}
	}()
	q.Push()
}

func TestCopyResultOverwritesAndReuses(t *testing.T) {
	src := bridge.StepResult{Sampled: []int32{4, -1}, DeviceMS: 1.5}
	dst := bridge.StepResult{Sampled: make([]int32, 5, 8), Logits: []float32{1, 2}, DeviceMS: 9, MoEWaitMS: 3}
	backing := &dst.Sampled[0]
	CopyResult(&dst, &src)
	if len(dst.Sampled) != 2 || dst.Sampled[0] != 4 || dst.Sampled[1] != -1 || &dst.Sampled[0] != backing ||
		len(dst.Logits) != 0 || dst.DeviceMS != 1.5 || dst.MoEWaitMS != 0 {
		t.Errorf("CopyResult gave %+v", dst)
	}
	src.Sampled[0] = 7
	if dst.Sampled[0] != 4 {
		t.Error("dst aliases src")
	}
}

func TestResize(t *testing.T) {
	s := make([]int32, 1, 4)
	if r := Resize(s, 3); len(r) != 3 || &r[0] != &s[0] {
		t.Errorf("Resize within capacity reallocated")
	}
	if r := Resize(s, 5); len(r) != 5 {
		t.Errorf("Resize(5) has length %d", len(r))
	}
}

// TestMix64Pinned pins the mixer: every fake and twin token depends on it.
func TestMix64Pinned(t *testing.T) {
	for x, want := range map[uint64]uint64{0: 0, 1: 0x5692161d100b05e5, 0x9e3779b97f4a7c15: 0xe220a8397b1dcdaf} {
		if got := Mix64(x); got != want {
			t.Errorf("Mix64(%#x) = %#x, want %#x", x, got, want)
		}
	}
}
