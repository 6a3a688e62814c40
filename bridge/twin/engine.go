package twin

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/internal/goengine"
)

// Engine is the digital twin's bridge.Engine: it validates every step as
// the native engine does, computes nothing, and reports the step's modelled
// device time (StepCost(...).MS()) in DeviceMS. It holds no page contents,
// so a step costs its validation (bridge.StepChecker: one compare per
// block-table entry, the contract every engine enforces) plus
// O(sequences + new tokens): it scales to fleets of ranks with long
// contexts.
//
// Sampled tokens are a hash of (seed, the sequence's last input token, that
// token's position) modulo the vocabulary (with SeqStep.Sampling: drawn by
// bridge.Sample from a row whose argmax is that token). They therefore do not depend on
// batching, chunking, rank count, preemption or recompute — the property the
// CPU engine has — but, unlike the CPU and fake engines, not on the earlier
// tokens or the pages either: a wrong block table goes unnoticed beyond the
// contract's index checks. Like every bridge.Engine it is not safe for
// concurrent use.
type Engine struct {
	cfg    bridge.Config
	p      *Profile
	shape  bridge.ModelShape
	closed bool

	works []Work // reused per step
	// memoWorks and memoCost are the last step's works and their cost.
	memoWorks []Work
	memoCost  StepCost
	last      StepCost // of the step most recently returned by Step or Wait
	// launched is the cost of the step most recently launched (Step or
	// Submit): what the virtual clock agrees on (virtual.go).
	launched StepCost
	fleet    []StepCost // reused by FleetStepMS
	// check is the step contract over cfg's geometry; nil after Close.
	check  *bridge.StepChecker
	row    []float32 // a logits row to sample from, reused
	hashes []uint64  // rowHashes scratch (scored rows), reused

	// inflight holds submitted steps' results, oldest first. The twin
	// computes at Submit, which is indistinguishable from a stream running
	// steps in submit order.
	inflight goengine.Queue[pendingStep]
}

// pendingStep is a submitted step's result and its cost (for LastStepCost
// once it is waited for).
type pendingStep struct {
	res  bridge.StepResult
	cost StepCost
}

var _ bridge.Engine = (*Engine)(nil)

// New builds a twin engine over a validated profile (which must not change
// afterwards). cfg.Preset, when set, must name the profile's model; an
// explicit cfg.Shape, when set, must equal the profile's Shape(). NumPages
// and TokensPerPage must be positive and NumHostPages ≥ 0 (size NumPages
// with Profile.PoolPages for --pages 0). Helix is not supported. Errors
// match bridge.ErrInvalidArgument or bridge.ErrUnsupported.
func New(cfg bridge.Config, p *Profile) (*Engine, error) {
	switch {
	case p == nil:
		return nil, invalid("init", "the twin engine needs a cost profile")
	case !p.ready:
		return nil, invalid("init", "cost profile not validated: call Validate (or use BuiltinProfile/LoadProfile)")
	case cfg.Helix != nil:
		return nil, bridge.StatusError("init", bridge.StatusUnsupported,
			"the twin engine does not model Helix context parallelism; use the cpu engine")
	}
	shape := p.Model.Shape()
	switch {
	case cfg.Preset != "" && cfg.Preset != p.Model.Name:
		return nil, invalid("init", "model %q does not match the cost profile's model %q", cfg.Preset, p.Model.Name)
	case cfg.Preset == "" && !cfg.Shape.Equal(bridge.ModelShape{}) && !cfg.Shape.Equal(shape):
		return nil, invalid("init", "model shape %+v does not match the cost profile's model %q (%+v)", cfg.Shape, p.Model.Name, shape)
	case cfg.NumPages <= 0:
		return nil, invalid("init", "num_pages must be positive, got %d", cfg.NumPages)
	case cfg.TokensPerPage <= 0:
		return nil, invalid("init", "tokens_per_page must be positive, got %d", cfg.TokensPerPage)
	case cfg.NumHostPages < 0:
		return nil, invalid("init", "num_host_pages must not be negative, got %d", cfg.NumHostPages)
	}
	return &Engine{cfg: cfg, p: p, shape: shape, check: bridge.NewStepChecker(bridge.GeometryOf(cfg, shape))}, nil
}

// Shape is the model's bridge shape (for MLA models the GQA-equivalent
// described at Model.Shape).
func (e *Engine) Shape() bridge.ModelShape { return e.shape }

// Profile is the engine's cost profile.
func (e *Engine) Profile() *Profile { return e.p }

// LastStepCost is the modelled cost of the step whose result was most
// recently returned (by Step or Wait); zero before the first.
func (e *Engine) LastStepCost() StepCost { return e.last }

// Close releases the engine. Later calls fail with bridge.ErrClosed; a
// second Close is a no-op.
func (e *Engine) Close() error {
	e.closed = true
	e.check = nil // its scratch holds a word per page
	return nil
}

// Step validates and models one step. res's slices are reused when large
// enough.
func (e *Engine) Step(desc *bridge.StepDesc, res *bridge.StepResult) error {
	if err := e.usable("step"); err != nil {
		return err
	}
	if desc == nil || res == nil {
		return invalid("step", "desc and res must not be nil")
	}
	if err := e.inflight.RequireIdle("step"); err != nil {
		return err
	}
	cost, err := e.run("step", desc, res)
	if err != nil {
		return err
	}
	e.last, e.launched = cost, cost
	return nil
}

// Submit validates and models a step and keeps its result for Wait.
func (e *Engine) Submit(desc *bridge.StepDesc) error {
	if err := e.usable("submit"); err != nil {
		return err
	}
	if desc == nil {
		return invalid("submit", "desc must not be nil")
	}
	slot, err := e.inflight.Next("submit")
	if err != nil {
		return err
	}
	cost, err := e.run("submit", desc, &slot.res)
	if err != nil {
		return err
	}
	slot.cost = cost
	e.launched = cost
	e.inflight.Push()
	return nil
}

// Wait returns the oldest submitted step's result.
func (e *Engine) Wait(res *bridge.StepResult) error {
	if err := e.usable("wait"); err != nil {
		return err
	}
	if res == nil {
		return invalid("wait", "res must not be nil")
	}
	slot, err := e.inflight.Pop("wait")
	if err != nil {
		return err
	}
	goengine.CopyResult(res, &slot.res)
	e.last = slot.cost
	return nil
}

// run validates the whole step (bridge.StepChecker: nothing is recorded
// when any sequence is invalid), models its cost and samples.
func (e *Engine) run(op string, desc *bridge.StepDesc, res *bridge.StepResult) (StepCost, error) {
	if err := e.check.Check(op, desc); err != nil {
		return StepCost{}, err
	}
	e.works = e.works[:0]
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		w := Work{NewTokens: len(sq.Tokens), KVBefore: sq.StartPos}
		for _, t := range sq.ScoreTargets {
			if t >= 0 {
				w.Scored++
			}
		}
		e.works = append(e.works, w)
	}
	// StepCost is a pure function of the works: a rank that repeats its
	// step (an idle rank's padding dummy, every iteration) reuses it.
	if !slices.Equal(e.works, e.memoWorks) || e.memoWorks == nil {
		e.memoCost = e.p.StepCost(e.works)
		e.memoWorks = append(e.memoWorks[:0], e.works...)
	}
	cost := e.memoCost

	// A sequence's token is the hash of the seed, its last token and that
	// token's position modulo the vocabulary (tokenHash).
	e.row = goengine.Sample(desc, res, e.shape.VocabSize, e.seqHash, appendLogits, e.row)
	e.hashes, e.row = goengine.Score(desc, res, e.shape.VocabSize, e.rowHashes, appendLogits, e.hashes, e.row)
	res.DeviceMS = cost.MS()
	res.MoEWaitMS = 0 // the twin reports no per-step MoE wait; res is overwritten whole
	return cost, nil
}

// CopyPages validates a page copy (bridge.CheckCopy: tiers, equal lengths,
// every index within its tier) and does nothing else: the twin holds no
// page contents. The host tier exists when NumHostPages > 0. Its time is
// not modelled.
func (e *Engine) CopyPages(srcTier bridge.Tier, src []int32, dstTier bridge.Tier, dst []int32) error {
	const op = "copy_pages"
	if err := e.usable(op); err != nil {
		return err
	}
	return bridge.CheckCopy(srcTier, src, dstTier, dst, e.check.Geometry())
}

// usable refuses calls on a closed or validate-only engine.
func (e *Engine) usable(op string) error {
	if e.closed {
		return fmt.Errorf("twin engine %s: %w", op, bridge.ErrClosed)
	}
	if e.cfg.ValidateOnly {
		return bridge.StatusError(op, bridge.StatusUnsupported, "validate-only engine runs no steps")
	}
	return nil
}

// invalid builds an INVALID_ARGUMENT error.
func invalid(op, format string, args ...any) error { return goengine.Invalid(op, format, args...) }

// tokenHash mixes the seed, a token and its position (splitmix64 rounds).
func tokenHash(seed uint64, tok int32, pos int) uint64 {
	return goengine.Mix64(seed ^ goengine.Mix64(uint64(uint32(tok))<<32|uint64(uint32(pos))) + 0x9e3779b97f4a7c15)
}

// appendLogits appends one row whose argmax is tok: values in [0, 1)
// derived from h, and 2 at tok. It differs from the fake's row on purpose
// (see bridge/fake appendLogits): stochastic sampling draws from it, so
// sharing one row function would change one engine's sampled tokens.
func appendLogits(dst []float32, h uint64, tok int32, vocab int) []float32 {
	start := len(dst)
	for v := 0; v < vocab; v++ {
		dst = append(dst, float32(goengine.Mix64(h+uint64(v))>>40)/(1<<24))
	}
	dst[start+int(tok)] = 2
	return dst
}

// seqHash is a sampling sequence's hash: its last token at its position.
func (e *Engine) seqHash(sq *bridge.SeqStep) uint64 {
	n := len(sq.Tokens)
	return tokenHash(e.cfg.Seed, sq.Tokens[n-1], sq.StartPos+n-1)
}

// rowHashes appends seqHash of sq cut after each of its tokens.
func (e *Engine) rowHashes(sq *bridge.SeqStep, dst []uint64) []uint64 {
	for k, t := range sq.Tokens {
		dst = append(dst, tokenHash(e.cfg.Seed, t, sq.StartPos+k))
	}
	return dst
}
