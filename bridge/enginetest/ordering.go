package enginetest

import (
	"errors"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// twoSteps are a prefill of X on pages 0-1 and a step that decodes X (it
// reads the prefill's pages) beside a second sequence on page 5: different
// shapes, so that their results cannot be confused.
func twoSteps() (prefill, decode *bridge.StepDesc) {
	x := prompt(6, 3)
	prefill = withLogits(bridge.SeqStep{Tokens: x, BlockTable: []int32{0, 1}, Sample: true})
	decode = withLogits(
		bridge.SeqStep{Tokens: prompt(1, 4), StartPos: 6, BlockTable: []int32{0, 1}, Sample: true},
		bridge.SeqStep{Tokens: prompt(3, 5), BlockTable: []int32{5}, Sample: true},
	)
	return prefill, decode
}

// submitWaitOrdering: Wait without a submitted step, a Submit beyond
// bridge.MaxInflight and a Step while steps are in flight are refused; Wait
// returns results in submit order; Submit copies the descriptor.
func (s *suite) submitWaitOrdering(t *testing.T) {
	prefill, decode := twoSteps()
	ref, _ := s.engine(t)
	want := []bridge.StepResult{step(t, ref, prefill), step(t, ref, decode)}

	e, _ := s.engine(t)
	var res bridge.StepResult
	wantInvalid(t, "wait with nothing submitted", e.Wait(&res), "wait", "no submitted step")
	submit(t, e, prefill)
	// Submit copies the descriptor: scribbling on ours after it must not
	// change the step.
	d := withLogits(append([]bridge.SeqStep(nil), decode.Seqs...)...)
	d.Seqs[0].Tokens = append([]int32(nil), decode.Seqs[0].Tokens...)
	submit(t, e, d)
	d.Seqs[0].Tokens[0], d.Seqs[0].StartPos, d.Seqs[1].BlockTable = 99, 0, nil
	if bridge.MaxInflight != 2 {
		t.Fatalf("bridge.MaxInflight = %d: the suite assumes 2", bridge.MaxInflight)
	}
	wantInvalid(t, "submit beyond MaxInflight", e.Submit(prefill), "submit")
	wantInvalid(t, "step while steps are in flight", e.Step(prefill, &res), "step")
	for i, w := range want {
		if got := wait(t, e); !s.sameOutput(got, w) {
			t.Errorf("wait %d: %v, want the %d-th submitted step's %v", i, got.Sampled, i, w.Sampled)
		}
	}
	wantInvalid(t, "wait after draining", e.Wait(&res), "wait", "no submitted step")
	// The refusals left the engine usable.
	if got := step(t, e, decode); !s.sameOutput(got, want[1]) {
		t.Errorf("step after the refusals: %v, want %v", got.Sampled, want[1].Sampled)
	}
}

// stepEqualsSubmitWait: the same steps give the same results through Step
// and through Submit+Wait, also pipelined (the decode submitted before the
// prefill is waited for sees the prefill's pages: stream order).
func (s *suite) stepEqualsSubmitWait(t *testing.T) {
	prefill, decode := twoSteps()
	ref, _ := s.engine(t)
	want := []bridge.StepResult{step(t, ref, prefill), step(t, ref, decode)}

	one, _ := s.engine(t)
	for i, d := range []*bridge.StepDesc{prefill, decode} {
		submit(t, one, d)
		if got := wait(t, one); !s.sameOutput(got, want[i]) {
			t.Errorf("submit+wait %d: %+v, want %+v", i, got, want[i])
		}
	}
	piped, _ := s.engine(t)
	submit(t, piped, prefill)
	submit(t, piped, decode)
	for i := range want {
		if got := wait(t, piped); !s.sameOutput(got, want[i]) {
			t.Errorf("pipelined wait %d: %+v, want %+v", i, got, want[i])
		}
	}
}

// copyOrderedAfterSubmit: a CopyPages issued while a step is in flight runs
// after it: the prefill's pages, copied out before Wait and back onto other
// pages, decode as the originals do.
func (s *suite) copyOrderedAfterSubmit(t *testing.T) {
	prefill, decode := twoSteps()
	ref, _ := s.engine(t)
	step(t, ref, prefill)
	want := step(t, ref, decode)

	e, _ := s.engine(t)
	submit(t, e, prefill)
	if err := e.CopyPages(bridge.TierDevice, []int32{0, 1}, bridge.TierHost, []int32{2, 3}); err != nil {
		t.Fatalf("copy while a step is in flight: %v", err)
	}
	wait(t, e)
	if err := e.CopyPages(bridge.TierHost, []int32{2, 3}, bridge.TierDevice, []int32{9, 12}); err != nil {
		t.Fatal(err)
	}
	moved := withLogits(append([]bridge.SeqStep(nil), decode.Seqs...)...)
	moved.Seqs[0].BlockTable = []int32{9, 12}
	if got := step(t, e, moved); !s.sameOutput(got, want) {
		t.Errorf("decode over the copied pages: %v, want %v", got.Sampled, want.Sampled)
	}
}

// emptyStep: a step of no sequences is valid, through Step and Submit.
func (s *suite) emptyStep(t *testing.T) {
	e, _ := s.engine(t)
	res := bridge.StepResult{Sampled: []int32{1, 2}, Logits: []float32{3}}
	if err := e.Step(withLogits(), &res); err != nil || len(res.Sampled) != 0 || len(res.Logits) != 0 {
		t.Errorf("empty step: %v, %+v", err, res)
	}
	submit(t, e, desc())
	if got := wait(t, e); len(got.Sampled) != 0 {
		t.Errorf("empty submitted step sampled %v", got.Sampled)
	}
}

// nilArguments are INVALID_ARGUMENT, not a crash.
func (s *suite) nilArguments(t *testing.T) {
	e, _ := s.engine(t)
	var res bridge.StepResult
	d := desc(bridge.SeqStep{Tokens: prompt(1, 1), BlockTable: []int32{0}})
	wantInvalid(t, "step nil desc", e.Step(nil, &res), "step")
	wantInvalid(t, "step nil res", e.Step(d, nil), "step")
	wantInvalid(t, "submit nil desc", e.Submit(nil), "submit")
	wantInvalid(t, "wait nil res", e.Wait(nil), "wait")
}

// close: Close with a step in flight returns; every later call fails with
// bridge.ErrClosed; a second Close is a no-op or ErrClosed as the engine
// promises (Capabilities.SecondCloseErrClosed).
func (s *suite) close(t *testing.T) {
	e, _ := s.engine(t)
	d := desc(bridge.SeqStep{Tokens: prompt(3, 1), BlockTable: []int32{0}, Sample: true})
	submit(t, e, d)
	if err := e.Close(); err != nil {
		t.Fatalf("close with a step in flight: %v", err)
	}
	var res bridge.StepResult
	for name, err := range map[string]error{
		"step":       e.Step(d, &res),
		"submit":     e.Submit(d),
		"wait":       e.Wait(&res),
		"copy_pages": e.CopyPages(bridge.TierDevice, []int32{0}, bridge.TierHost, []int32{0}),
	} {
		if !errors.Is(err, bridge.ErrClosed) {
			t.Errorf("%s after close: %v, want bridge.ErrClosed", name, err)
		}
	}
	err := e.Close()
	if s.caps.SecondCloseErrClosed && !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("second close: %v, want bridge.ErrClosed", err)
	}
	if !s.caps.SecondCloseErrClosed && err != nil {
		t.Errorf("second close: %v, want a no-op", err)
	}
}

// validateOnly: an engine created with ValidateOnly refuses to step or
// copy with UNSUPPORTED.
func (s *suite) validateOnly(t *testing.T) {
	e, _ := s.engine(t, func(c *bridge.Config) { c.ValidateOnly = true })
	d := desc(bridge.SeqStep{Tokens: prompt(1, 1), BlockTable: []int32{0}, Sample: true})
	var res bridge.StepResult
	for name, err := range map[string]error{
		"step":       e.Step(d, &res),
		"submit":     e.Submit(d),
		"copy_pages": e.CopyPages(bridge.TierDevice, []int32{0}, bridge.TierHost, []int32{0}),
	} {
		if !errors.Is(err, bridge.ErrUnsupported) {
			t.Errorf("validate-only %s: %v, want bridge.ErrUnsupported", name, err)
		}
	}
}
