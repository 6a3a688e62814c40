package twin

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
)

// Engine is the digital twin's bridge.Engine: it validates every step as
// the native engine does, computes nothing, and reports the step's modelled
// device time (StepCost(...).MS()) in DeviceMS. It holds no page contents,
// so a step costs O(sequences + new tokens + pages written), never
// O(context): it scales to fleets of ranks with long contexts.
//
// Sampled tokens are a hash of (seed, the sequence's last input token, that
// token's position) modulo the vocabulary (with SeqStep.Sampling: drawn by
// bridge.Sample from a row whose argmax is that token). They therefore do not depend on
// batching, chunking, rank count, preemption or recompute — the property the
// CPU engine has — but, unlike the CPU and fake engines, not on the earlier
// tokens or the pages either: a wrong block table goes unnoticed beyond the
// index checks below. Like every bridge.Engine it is not safe for
// concurrent use.
type Engine struct {
	cfg    bridge.Config
	p      *Profile
	shape  bridge.ModelShape
	closed bool

	works []Work   // reused per step
	last  StepCost // of the step most recently returned by Step or Wait
	// launched is the cost of the step most recently launched (Step or
	// Submit): what the virtual clock agrees on (virtual.go).
	launched StepCost
	fleet    []StepCost // reused by FleetStepMS
	// writer[page] is 1 + the sequence writing page in the step being
	// validated (0: none); touched lists the pages to reset. Allocated at
	// the first step.
	writer  []int32
	touched []int32
	row     []float32 // a logits row to sample from, reused

	// inflight is a ring of submitted steps' results, oldest at head. The
	// twin computes at Submit, which is indistinguishable from a stream
	// running steps in submit order.
	inflight [bridge.MaxInflight]pendingStep
	head, n  int
}

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
	case cfg.Preset == "" && cfg.Shape != (bridge.ModelShape{}) && cfg.Shape != shape:
		return nil, invalid("init", "model shape %+v does not match the cost profile's model %q (%+v)", cfg.Shape, p.Model.Name, shape)
	case cfg.NumPages <= 0:
		return nil, invalid("init", "num_pages must be positive, got %d", cfg.NumPages)
	case cfg.TokensPerPage <= 0:
		return nil, invalid("init", "tokens_per_page must be positive, got %d", cfg.TokensPerPage)
	case cfg.NumHostPages < 0:
		return nil, invalid("init", "num_host_pages must not be negative, got %d", cfg.NumHostPages)
	}
	return &Engine{cfg: cfg, p: p, shape: shape}, nil
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
	e.writer, e.touched = nil, nil
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
	if e.n > 0 {
		return invalid("step", "%d submitted steps have not been waited for", e.n)
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
	if e.n >= bridge.MaxInflight {
		return invalid("submit", "%d steps are already in flight", e.n)
	}
	slot := &e.inflight[(e.head+e.n)%bridge.MaxInflight]
	cost, err := e.run("submit", desc, &slot.res)
	if err != nil {
		return err
	}
	slot.cost = cost
	e.launched = cost
	e.n++
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
	if e.n == 0 {
		return invalid("wait", "no submitted step to wait for")
	}
	slot := &e.inflight[e.head]
	res.Sampled = append(res.Sampled[:0], slot.res.Sampled...)
	res.Logits = append(res.Logits[:0], slot.res.Logits...)
	res.DeviceMS = slot.res.DeviceMS
	e.last = slot.cost
	e.head = (e.head + 1) % bridge.MaxInflight
	e.n--
	return nil
}

// run validates the whole step (nothing is recorded when any sequence is
// invalid), models its cost and samples.
func (e *Engine) run(op string, desc *bridge.StepDesc, res *bridge.StepResult) (StepCost, error) {
	for i := range desc.Seqs {
		if err := e.validateSeq(op, i, &desc.Seqs[i]); err != nil {
			return StepCost{}, err
		}
	}
	if err := e.checkWrites(op, desc.Seqs); err != nil {
		return StepCost{}, err
	}
	e.works = e.works[:0]
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		e.works = append(e.works, Work{NewTokens: len(sq.Tokens), KVBefore: sq.StartPos})
	}
	cost := e.p.StepCost(e.works)

	vocab := e.shape.VocabSize
	res.Sampled = resize(res.Sampled, len(desc.Seqs))
	res.Logits = res.Logits[:0]
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		if !sq.Sample {
			res.Sampled[i] = -1
			continue
		}
		n := len(sq.Tokens)
		h := tokenHash(e.cfg.Seed, sq.Tokens[n-1], sq.StartPos+n-1)
		tok := int32(h % uint64(vocab))
		if sq.Sampling.IsGreedy() {
			res.Sampled[i] = tok
		} else {
			// Sample from the row whose argmax is tok: O(vocab) for this
			// sequence, only when it asks for sampling.
			e.row = appendLogits(e.row[:0], h, tok, vocab)
			res.Sampled[i] = bridge.Sample(e.row, sq.Sampling, sq.SamplePos())
		}
		if desc.WantLogits {
			res.Logits = appendLogits(res.Logits, h, tok, vocab)
		}
	}
	res.DeviceMS = cost.MS()
	return cost, nil
}

// validateSeq checks one sequence's fields as engine.h describes them; the
// message names the field and the sequence. Block-table entries are
// checked only where the step writes (checkWrites): checking every entry
// would cost O(context) per step.
func (e *Engine) validateSeq(op string, i int, sq *bridge.SeqStep) error {
	n, P := len(sq.Tokens), e.cfg.TokensPerPage
	switch {
	case n < 1:
		return invalid(op, "seqs[%d]: num_tokens must be >= 1, got %d", i, n)
	case sq.StartPos < 0:
		return invalid(op, "seqs[%d]: start_pos must be >= 0, got %d", i, sq.StartPos)
	case int64(sq.StartPos)+int64(n) > 1<<31-1:
		return invalid(op, "seqs[%d]: start_pos + num_tokens = %d exceeds the int32 position range", i, int64(sq.StartPos)+int64(n))
	case sq.StartPos+n > len(sq.BlockTable)*P:
		return invalid(op, "seqs[%d]: num_blocks %d covers %d tokens, positions up to %d need %d blocks",
			i, len(sq.BlockTable), len(sq.BlockTable)*P, sq.StartPos+n-1, (sq.StartPos+n+P-1)/P)
	}
	if err := sq.Sampling.Validate(); err != nil {
		return invalid(op, "seqs[%d]: %v", i, err)
	}
	for k, t := range sq.Tokens {
		if t < 0 || int(t) >= e.shape.VocabSize {
			return invalid(op, "seqs[%d]: tokens[%d] = %d outside [0, vocab_size %d)", i, k, t, e.shape.VocabSize)
		}
	}
	return nil
}

// checkWrites checks the block-table entries of the pages each sequence
// writes (those holding its new positions): within [0, num_pages) and not
// written by another sequence of the step (sequences may share pages they
// only read, a common prefix).
func (e *Engine) checkWrites(op string, seqs []bridge.SeqStep) error {
	if e.writer == nil {
		e.writer = make([]int32, e.cfg.NumPages)
	}
	defer func() {
		for _, pg := range e.touched {
			e.writer[pg] = 0
		}
		e.touched = e.touched[:0]
	}()
	P := e.cfg.TokensPerPage
	for i := range seqs {
		sq := &seqs[i]
		first, last := sq.StartPos/P, (sq.StartPos+len(sq.Tokens)-1)/P
		for k := first; k <= last; k++ {
			pg := sq.BlockTable[k]
			switch {
			case pg < 0 || int(pg) >= e.cfg.NumPages:
				return invalid(op, "seqs[%d]: block_table[%d] = %d outside [0, num_pages %d)", i, k, pg, e.cfg.NumPages)
			case e.writer[pg] == 0:
				e.writer[pg] = int32(i + 1)
				e.touched = append(e.touched, pg)
			case e.writer[pg] != int32(i+1):
				return invalid(op, "seqs[%d]: block_table[%d] = page %d is also written by seqs[%d] in this step; "+
					"sequences of one step may share pages only for reading", i, k, pg, e.writer[pg]-1)
			}
		}
	}
	return nil
}

// CopyPages validates a page copy (tiers, equal lengths, every index within
// its tier) and does nothing else: the twin holds no page contents. The
// host tier exists when NumHostPages > 0. Its time is not modelled.
func (e *Engine) CopyPages(srcTier bridge.Tier, src []int32, dstTier bridge.Tier, dst []int32) error {
	const op = "copy_pages"
	if err := e.usable(op); err != nil {
		return err
	}
	nFrom, err := e.tierPages(op, srcTier)
	if err != nil {
		return err
	}
	nTo, err := e.tierPages(op, dstTier)
	if err != nil {
		return err
	}
	if len(src) != len(dst) {
		return invalid(op, "src has %d pages, dst %d: lengths must be equal", len(src), len(dst))
	}
	for k := range src {
		if src[k] < 0 || int(src[k]) >= nFrom {
			return invalid(op, "src[%d] = %d outside %s pages [0, %d)", k, src[k], tierName(srcTier), nFrom)
		}
		if dst[k] < 0 || int(dst[k]) >= nTo {
			return invalid(op, "dst[%d] = %d outside %s pages [0, %d)", k, dst[k], tierName(dstTier), nTo)
		}
	}
	return nil
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

// tierPages is a tier's page count.
func (e *Engine) tierPages(op string, tier bridge.Tier) (int, error) {
	switch tier {
	case bridge.TierDevice:
		return e.cfg.NumPages, nil
	case bridge.TierHost:
		return e.cfg.NumHostPages, nil
	}
	return 0, invalid(op, "tier must be 0 (device) or 1 (host), got %d", int(tier))
}

func tierName(t bridge.Tier) string {
	if t == bridge.TierHost {
		return "host"
	}
	return "device"
}

// invalid builds an INVALID_ARGUMENT error.
func invalid(op, format string, args ...any) error {
	return bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf(format, args...))
}

// tokenHash mixes the seed, a token and its position (splitmix64 rounds).
func tokenHash(seed uint64, tok int32, pos int) uint64 {
	return mix64(seed ^ mix64(uint64(uint32(tok))<<32|uint64(uint32(pos))) + 0x9e3779b97f4a7c15)
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// appendLogits appends one row whose argmax is tok: values in [0, 1)
// derived from h, and 2 at tok.
func appendLogits(dst []float32, h uint64, tok int32, vocab int) []float32 {
	start := len(dst)
	for v := 0; v < vocab; v++ {
		dst = append(dst, float32(mix64(h+uint64(v))>>40)/(1<<24))
	}
	dst[start+int(tok)] = 2
	return dst
}

// resize returns s with length n, reusing its array when large enough.
func resize(s []int32, n int) []int32 {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]int32, n)
}
