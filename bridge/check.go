package bridge

import (
	"fmt"
	"math"
)

// Geometry is everything the step and page-copy contract depends on: the
// engine's page slabs, its page size, its vocabulary and its place in a
// Helix group. GeometryOf derives it from an engine's Config and shape.
type Geometry struct {
	DevicePages   int // pages of the device tier (Config.NumPages)
	HostPages     int // pages of the host tier (Config.NumHostPages); 0 = no host tier
	TokensPerPage int // P (Config.TokensPerPage); must be ≥ 1
	VocabSize     int // token ids lie in [0, VocabSize)
	// HelixSize and HelixRank place the engine in a Helix CP group
	// (HelixSize ≤ 1: none). Under Helix a block-table entry is a local page
	// holding one ledger block of TokensPerPage·HelixSize global tokens, and
	// the member writes only the global pages g with g % HelixSize ==
	// HelixRank (kvcache.md §10; native/src/engine.cpp build_batch).
	HelixSize, HelixRank int
}

// GeometryOf is the geometry of an engine built from cfg whose resolved
// model shape is shape (the engine's Shape()).
func GeometryOf(cfg Config, shape ModelShape) Geometry {
	g := Geometry{DevicePages: cfg.NumPages, HostPages: cfg.NumHostPages,
		TokensPerPage: cfg.TokensPerPage, VocabSize: shape.VocabSize, HelixSize: 1}
	if h := cfg.Helix; h != nil {
		g.HelixSize, g.HelixRank = h.Size, h.Rank
	}
	return g
}

// cp is the Helix group size, 1 without Helix.
func (g Geometry) cp() int64 { return max(1, int64(g.HelixSize)) }

// tierPages is a tier's page count; false for a tier that is neither
// device nor host.
func (g Geometry) tierPages(t Tier) (int, bool) {
	switch t {
	case TierDevice:
		return g.DevicePages, true
	case TierHost:
		return g.HostPages, true
	}
	return 0, false
}

// String names the tier as the engines' messages do ("device", "host").
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host"
	}
	return fmt.Sprintf("Tier(%d)", int(t))
}

// StepChecker checks step descriptors against one geometry. It is the one
// definition of a valid step (DESIGN.md §1): the pure-Go engines call it
// before they touch anything, and the native engine's C++ validation
// (native/src/engine.cpp build_batch) refuses exactly the same descriptors,
// which bridge/enginetest checks for every engine. It keeps scratch between
// calls, so a steady-state Check allocates nothing; like an engine it is not
// safe for concurrent use.
type StepChecker struct {
	g Geometry
	// writer[page] is 1 + the sequence that writes page in the step being
	// checked (0: none); touched lists the pages to reset afterwards.
	// Allocated at the first step that writes.
	writer  []int32
	touched []int32
}

// NewStepChecker returns a checker for g (g.TokensPerPage ≥ 1).
func NewStepChecker(g Geometry) *StepChecker { return &StepChecker{g: g} }

// Geometry is the geometry the checker checks against.
func (c *StepChecker) Geometry() Geometry { return c.g }

// CheckStep checks desc against g as a Step would (errors name op "step").
// It allocates scratch of g.DevicePages entries per call; engines keep a
// StepChecker instead. See StepChecker.Check for the rules.
func CheckStep(desc *StepDesc, g Geometry) error {
	return NewStepChecker(g).Check("step", desc)
}

// Check returns nil when desc is a valid step, else an INVALID_ARGUMENT
// *Error whose Op is op and whose message names the sequence (seqs[i]) and
// the field. The rules, per sequence i in order (the first broken one is
// reported):
//
//   - num_tokens: at least one token;
//   - start_pos ≥ 0, and start_pos + num_tokens ≤ 2^31−1 (positions are
//     int32 in the ABI);
//   - num_blocks: the block table covers positions [0, start_pos +
//     num_tokens), at TokensPerPage·HelixSize tokens per entry;
//   - sampling: SamplingParams.Validate (checked sampled or not);
//   - logprobs: SeqStep.ValidateLogprobs (TopLogprobs in [0, MaxLogprobs],
//     only with Logprobs);
//   - allowed: ValidateAllowed (nil, or a mask of the vocabulary that
//     allows some token);
//   - scoring: SeqStep.ValidateScore (targets one per token, −1 or in
//     the vocabulary; ScoreTop in [0, MaxLogprobs]);
//   - tokens: every id in [0, VocabSize);
//   - block_table: every entry, read or written, in [0, DevicePages);
//
// then, over the whole step, no device page is written (holds a new
// position of) by two sequences: sequences may share pages only for
// reading (a common prefix). An empty step is valid.
//
// The ABI's int32 limits on a step's total sequences, tokens and block
// entries are not checked: reaching them takes 8 GiB of indices.
func (c *StepChecker) Check(op string, desc *StepDesc) error {
	if desc == nil {
		return invalid(op, "desc must not be nil")
	}
	for i := range desc.Seqs {
		if err := c.checkSeq(op, i, &desc.Seqs[i]); err != nil {
			return err
		}
	}
	return c.checkWrites(op, desc.Seqs)
}

// checkSeq checks one sequence's own fields.
func (c *StepChecker) checkSeq(op string, i int, sq *SeqStep) error {
	n := len(sq.Tokens)
	ledger := int64(c.g.TokensPerPage) * c.g.cp()
	end := int64(sq.StartPos) + int64(n)
	covered := int64(len(sq.BlockTable)) * ledger
	switch {
	case n < 1:
		return invalid(op, "seqs[%d]: num_tokens must be >= 1, got %d", i, n)
	case sq.StartPos < 0:
		return invalid(op, "seqs[%d]: start_pos must be >= 0, got %d", i, sq.StartPos)
	case end > math.MaxInt32:
		return invalid(op, "seqs[%d]: start_pos + num_tokens = %d exceeds the int32 position range", i, end)
	case end > covered:
		return invalid(op, "seqs[%d]: num_blocks %d covers %d tokens, positions up to %d need %d blocks",
			i, len(sq.BlockTable), covered, end-1, (end+ledger-1)/ledger)
	}
	if err := sq.Sampling.Validate(); err != nil {
		return invalid(op, "seqs[%d]: %v", i, err)
	}
	if err := sq.ValidateLogprobs(); err != nil {
		return invalid(op, "seqs[%d]: %v", i, err)
	}
	V := c.g.VocabSize
	if err := sq.ValidateScore(V); err != nil {
		return invalid(op, "seqs[%d]: %v", i, err)
	}
	if err := ValidateAllowed(sq.Allowed, V); err != nil {
		return invalid(op, "seqs[%d]: %v", i, err)
	}
	for k, t := range sq.Tokens {
		if t < 0 || int(t) >= V {
			return invalid(op, "seqs[%d]: tokens[%d] = %d outside [0, vocab_size %d)", i, k, t, V)
		}
	}
	// One unsigned compare per entry: this loop is the contract's only
	// O(context) part, run by the twin at fleet scale.
	pages := uint32(max(0, min(c.g.DevicePages, math.MaxInt32)))
	for k, p := range sq.BlockTable {
		if uint32(p) >= pages {
			return invalid(op, "seqs[%d]: block_table[%d] = %d outside [0, num_pages %d)", i, k, p, c.g.DevicePages)
		}
	}
	return nil
}

// checkWrites refuses a device page written by two sequences of one step:
// their results would depend on each other and on the order of the writes.
// Runs after checkSeq accepted every sequence, so every index is in range.
func (c *StepChecker) checkWrites(op string, seqs []SeqStep) error {
	defer func() {
		for _, pg := range c.touched {
			c.writer[pg] = 0
		}
		c.touched = c.touched[:0]
	}()
	P, cp := c.g.TokensPerPage, int(c.g.cp())
	for i := range seqs {
		sq := &seqs[i]
		first, last := sq.StartPos/P, (sq.StartPos+len(sq.Tokens)-1)/P
		for g := first; g <= last; g++ {
			// Global page g; under Helix only the member owning it writes it.
			if cp > 1 && g%cp != c.g.HelixRank {
				continue
			}
			k := g / cp
			pg := sq.BlockTable[k]
			if c.writer == nil {
				c.writer = make([]int32, c.g.DevicePages)
			}
			switch c.writer[pg] {
			case 0:
				c.writer[pg] = int32(i + 1)
				c.touched = append(c.touched, pg)
			case int32(i + 1): // this sequence's own page again
			default:
				return invalid(op, "seqs[%d]: block_table[%d] = page %d is also written by seqs[%d] in this step; "+
					"sequences of one step may share pages only for reading", i, k, pg, c.writer[pg]-1)
			}
		}
	}
	return nil
}

// CheckCopy is the one definition of a valid page copy
// (Engine.CopyPages, eng_engine_copy_pages): both tiers are 0 (device) or
// 1 (host), src and dst have equal lengths, and every src[k] and dst[k]
// lies within its tier's pages (a host tier of 0 pages holds none). It
// returns nil or an INVALID_ARGUMENT *Error of op "copy_pages" naming the
// field (src[k], dst[k]); the first broken rule in that order, k ascending,
// is reported. Copying a page onto itself, or one page to several, is
// valid. Engines check the whole list before copying anything, so a refused
// copy changes nothing.
func CheckCopy(srcTier Tier, src []int32, dstTier Tier, dst []int32, g Geometry) error {
	const op = "copy_pages"
	nFrom, ok := g.tierPages(srcTier)
	if !ok {
		return invalid(op, "tier must be 0 (device) or 1 (host), got %d", int(srcTier))
	}
	nTo, ok := g.tierPages(dstTier)
	if !ok {
		return invalid(op, "tier must be 0 (device) or 1 (host), got %d", int(dstTier))
	}
	if len(src) != len(dst) {
		return invalid(op, "src has %d pages, dst %d: lengths must be equal", len(src), len(dst))
	}
	for k := range src {
		if src[k] < 0 || int(src[k]) >= nFrom {
			return invalid(op, "src[%d] = %d outside %s pages [0, %d)", k, src[k], srcTier, nFrom)
		}
		if dst[k] < 0 || int(dst[k]) >= nTo {
			return invalid(op, "dst[%d] = %d outside %s pages [0, %d)", k, dst[k], dstTier, nTo)
		}
	}
	return nil
}

// invalid builds an INVALID_ARGUMENT error of op.
func invalid(op, format string, args ...any) error {
	return StatusError(op, StatusInvalidArgument, fmt.Sprintf(format, args...))
}
