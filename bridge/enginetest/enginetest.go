// Package enginetest is the conformance suite every bridge.Engine passes
// (DESIGN.md §1): the fake, the twin and the native engines each run it
// from a small test in their own package, as ggml tests every backend
// against one suite. It checks the one step and copy contract
// (bridge.StepChecker, bridge.CheckCopy) against what the engine refuses,
// the Submit/Wait ordering, that Step equals Submit+Wait, determinism, the
// result-reuse rules and the lifecycle (Close, validate-only). Where
// engines legitimately differ, a Capabilities flag says which behaviour the
// engine promises and the suite checks that one; nothing is skipped
// silently.
//
// It is a test helper: only _test.go files may import it
// (tests/deps_test.go).
package enginetest

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Opener opens the engine under test for cfg. The suite closes every engine
// it opens. An engine that needs more than a Config (the twin's cost
// profile) derives it from cfg.Preset.
type Opener func(cfg bridge.Config) (bridge.Engine, error)

// Capabilities are the behaviours in which engines legitimately differ.
// Each flag names the behaviour the engine promises; the suite checks that
// behaviour whichever way the flag is set, or, where the other way promises
// nothing, says so in a skip message.
type Capabilities struct {
	// ReadsPages: a sampled token's logits depend on what the step reads
	// back from the block table's pages, so a wrong block table, a
	// corrupted or a copied page shows (fake, native). False: they depend
	// on the step's own tokens and positions only, and the suite checks
	// that pages do not matter (twin).
	ReadsPages bool
	// BatchInvariant: a sequence's sampled tokens and logits are
	// bit-identical whatever else is in its step and however its prompt is
	// chunked (fake, twin, native CPU).
	BatchInvariant bool
	// ModelledTime: DeviceMS is a deterministic function of the step
	// (fake, twin); false for measured time (native).
	ModelledTime bool
	// SecondCloseErrClosed: a second Close fails with bridge.ErrClosed
	// (native); false: it is a no-op returning nil (fake, twin).
	SecondCloseErrClosed bool
}

// Geometry of the suite's engines: pages of TokensPerPage tokens. Tests
// place sequences on explicit pages, so the numbers are fixed.
const (
	TokensPerPage = 4
	DevicePages   = 16
	HostPages     = 4
)

// Config is the configuration the suite opens engines with: the tiny
// preset (vocabulary 512) with DevicePages device and HostPages host pages
// of TokensPerPage tokens.
func Config() bridge.Config {
	return bridge.Config{Preset: "tiny", Seed: 7, NumPages: DevicePages, TokensPerPage: TokensPerPage,
		NumHostPages: HostPages}
}

// Run runs the suite against the engines open opens, as subtests of t.
func Run(t *testing.T, open Opener, caps Capabilities) {
	s := &suite{open: open, caps: caps}
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"StepValidation", s.stepValidation},
		{"ValidSteps", s.validSteps},
		{"CopyValidation", s.copyValidation},
		{"SubmitWaitOrdering", s.submitWaitOrdering},
		{"StepEqualsSubmitWait", s.stepEqualsSubmitWait},
		{"CopyOrderedAfterSubmit", s.copyOrderedAfterSubmit},
		{"Determinism", s.determinism},
		{"BatchInvariance", s.batchInvariance},
		{"PageContent", s.pageContent},
		{"LogitsAndSampling", s.logitsAndSampling},
		{"Logprobs", s.logprobs},
		{"AllowedMask", s.allowedMask},
		{"PromptScores", s.promptScores},
		{"ResultReuse", s.resultReuse},
		{"EmptyStep", s.emptyStep},
		{"NilArguments", s.nilArguments},
		{"Close", s.close},
		{"ValidateOnly", s.validateOnly},
	} {
		t.Run(c.name, c.run)
	}
}

type suite struct {
	open Opener
	caps Capabilities
}

// engine opens an engine of Config() as edited, closed at the end of t.
func (s *suite) engine(t *testing.T, edit ...func(*bridge.Config)) (bridge.Engine, bridge.Config) {
	t.Helper()
	cfg := Config()
	for _, f := range edit {
		f(&cfg)
	}
	e, err := s.open(cfg)
	if err != nil {
		t.Fatalf("open %+v: %v", cfg, err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, cfg
}

// prompt returns n deterministic tokens below 500 (every engine's
// vocabulary is larger).
func prompt(n, salt int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*37 + salt*101 + 5) % 500)
	}
	return out
}

// desc builds a step of seqs.
func desc(seqs ...bridge.SeqStep) *bridge.StepDesc { return &bridge.StepDesc{Seqs: seqs} }

// withLogits builds a step of seqs that asks for logits.
func withLogits(seqs ...bridge.SeqStep) *bridge.StepDesc {
	return &bridge.StepDesc{Seqs: seqs, WantLogits: true}
}

// step runs d and returns a copy of its result (the engine reuses its own).
func step(t *testing.T, e bridge.Engine, d *bridge.StepDesc) bridge.StepResult {
	t.Helper()
	var res bridge.StepResult
	if err := e.Step(d, &res); err != nil {
		t.Fatalf("step: %v", err)
	}
	return res
}

// wait waits for the oldest submitted step and returns its result.
func wait(t *testing.T, e bridge.Engine) bridge.StepResult {
	t.Helper()
	var res bridge.StepResult
	if err := e.Wait(&res); err != nil {
		t.Fatalf("wait: %v", err)
	}
	return res
}

func submit(t *testing.T, e bridge.Engine, d *bridge.StepDesc) {
	t.Helper()
	if err := e.Submit(d); err != nil {
		t.Fatalf("submit: %v", err)
	}
}

// sameOutput reports whether two results have the same tokens and
// bit-identical logits (and, with modelled time, the same DeviceMS).
func (s *suite) sameOutput(a, b bridge.StepResult) bool {
	if !slices.Equal(a.Sampled, b.Sampled) || len(a.Logits) != len(b.Logits) {
		return false
	}
	for i := range a.Logits {
		if math.Float32bits(a.Logits[i]) != math.Float32bits(b.Logits[i]) {
			return false
		}
	}
	return !s.caps.ModelledTime || a.DeviceMS == b.DeviceMS
}

// normalise lower-cases a message and drops underscores, so that one
// keyword matches the Go engines' "start_pos" and native's "StartPos".
func normalise(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "") }

// wantInvalid fails unless err is an INVALID_ARGUMENT *bridge.Error of op
// whose message contains every keyword (compared normalised).
func wantInvalid(t *testing.T, what string, err error, op string, keywords ...string) {
	t.Helper()
	var e *bridge.Error
	if !errors.As(err, &e) || !errors.Is(err, bridge.ErrInvalidArgument) || e.Op != op {
		t.Errorf("%s: %v, want an INVALID_ARGUMENT error of %s", what, err, op)
		return
	}
	msg := normalise(e.Msg)
	for _, k := range keywords {
		if !strings.Contains(msg, normalise(k)) {
			t.Errorf("%s: %q does not name %q", what, e.Msg, k)
		}
	}
}
