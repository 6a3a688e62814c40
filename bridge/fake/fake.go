// Package fake holds pure-Go engines behind bridge.Engine for tests and
// simulation. Engine (this file) is the deterministic fake of DESIGN.md §3:
// it keeps a real slab of pages, writes every step's tokens into the pages
// its block tables name, and samples a token that is a hash of what it reads
// back. So, like the real engines, its results depend only on a sequence's
// content (never on batching or chunking), and a wrong block table, a
// corrupted page or a lost page copy changes them.
package fake

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/internal/goengine"
)

// emptySlot marks a page slot that no step has written. It is not a valid
// token, so reading it (a block table pointing at the wrong page) changes the
// sampled hash.
const emptySlot int32 = -1

// Engine is the deterministic fake engine. Like every bridge.Engine it is not
// safe for concurrent use.
type Engine struct {
	shape bridge.ModelShape
	cfg   bridge.Config
	// device and host are the page slabs: page p's slot s is at p·P+s.
	// A validate-only engine has neither.
	device []int32
	host   []int32
	closed bool
	check  *bridge.StepChecker // the step contract over cfg's geometry
	// inflight holds the results of submitted steps, oldest first. The fake
	// computes at Submit (its compute is instant), which is indistinguishable
	// from a stream that runs steps in submit order.
	inflight goengine.Queue[bridge.StepResult]
	row      []float32 // a pseudo-logits row to sample from, reused
	hashes   []uint64  // rowHashes scratch (scored rows), reused
}

var _ bridge.Engine = (*Engine)(nil)

// New builds a fake engine. The shape comes from cfg.Preset (via
// bridge.LookupPreset) or, when Preset is "", from cfg.Shape, which must be
// valid. NumPages and TokensPerPage must be positive, NumHostPages ≥ 0.
// Errors match bridge.ErrInvalidArgument.
func New(cfg bridge.Config) (*Engine, error) {
	if cfg.Helix != nil {
		return nil, bridge.StatusError("init", bridge.StatusUnsupported,
			"the fake engine does not implement Helix context parallelism; use the cpu engine")
	}
	shape, err := resolveShape(cfg)
	if err != nil {
		return nil, bridge.StatusError("init", bridge.StatusInvalidArgument, err.Error())
	}
	switch {
	case cfg.NumPages <= 0:
		return nil, invalid("init", "num_pages must be positive, got %d", cfg.NumPages)
	case cfg.TokensPerPage <= 0:
		return nil, invalid("init", "tokens_per_page must be positive, got %d", cfg.TokensPerPage)
	case cfg.NumHostPages < 0:
		return nil, invalid("init", "num_host_pages must not be negative, got %d", cfg.NumHostPages)
	}
	e := &Engine{shape: shape, cfg: cfg, check: bridge.NewStepChecker(bridge.GeometryOf(cfg, shape))}
	if !cfg.ValidateOnly {
		e.device = newSlab(cfg.NumPages * cfg.TokensPerPage)
		e.host = newSlab(cfg.NumHostPages * cfg.TokensPerPage)
	}
	return e, nil
}

// resolveShape picks the preset or the explicit shape.
func resolveShape(cfg bridge.Config) (bridge.ModelShape, error) {
	if cfg.Preset != "" {
		return bridge.LookupPreset(cfg.Preset)
	}
	if err := cfg.Shape.Validate(); err != nil {
		return bridge.ModelShape{}, err
	}
	return cfg.Shape, nil
}

// newSlab returns n empty slots.
func newSlab(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = emptySlot
	}
	return s
}

// Shape is the resolved model shape.
func (e *Engine) Shape() bridge.ModelShape { return e.shape }

// Close releases the slabs. Later calls fail with bridge.ErrClosed; a second
// Close is a no-op.
func (e *Engine) Close() error {
	e.closed = true
	e.device, e.host = nil, nil
	return nil
}

// ReadPage returns a copy of one page's token slots (-1 where nothing was
// written), for tests that check what landed where.
func (e *Engine) ReadPage(tier bridge.Tier, page int32) ([]int32, error) {
	if err := e.usable("read_page"); err != nil {
		return nil, err
	}
	slab, n, err := e.slab("read_page", tier)
	if err != nil {
		return nil, err
	}
	if page < 0 || int(page) >= n {
		return nil, invalid("read_page", "page %d outside %s pages [0, %d)", page, tier, n)
	}
	P := e.cfg.TokensPerPage
	return append([]int32(nil), slab[int(page)*P:(int(page)+1)*P]...), nil
}

// usable refuses calls on a closed or validate-only engine.
func (e *Engine) usable(op string) error {
	if e.closed {
		return fmt.Errorf("fake engine %s: %w", op, bridge.ErrClosed)
	}
	if e.cfg.ValidateOnly {
		return bridge.StatusError(op, bridge.StatusUnsupported, "validate-only engine allocates no pages")
	}
	return nil
}

// slab returns a tier's slab and its page count.
func (e *Engine) slab(op string, tier bridge.Tier) ([]int32, int, error) {
	switch tier {
	case bridge.TierDevice:
		return e.device, e.cfg.NumPages, nil
	case bridge.TierHost:
		return e.host, e.cfg.NumHostPages, nil
	}
	return nil, 0, invalid(op, "tier must be 0 (device) or 1 (host), got %d", int(tier))
}

// invalid builds an INVALID_ARGUMENT error.
func invalid(op, format string, args ...any) error { return goengine.Invalid(op, format, args...) }
