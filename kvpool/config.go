package kvpool

import (
	"errors"
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Config sizes and configures a Manager. The zero value of every optional
// field is the behaviour of the first cut (no reuse, no host tier, no events,
// no Helix, no row limit), so callers opt in feature by feature. The CLI maps
// the spec's defaults (kvcache.md §3.1: reuse on, partial reuse on) onto it.
type Config struct {
	// NumPages is the number of device-tier (GPU) pages (> 0).
	NumPages int
	// TokensPerPage is P, the tokens one page holds (> 0).
	TokensPerPage int
	// HostPages is the host-tier size in pages; 0 = no host tier. With a host
	// tier, suspended sequences' pages migrate to host pages under GPU
	// pressure (kvcache.md §4.2) and come back on resume (§5.2).
	HostPages int
	// MaxSeqLen is the longest sequence in (global) tokens; 0 means
	// unlimited. It caps a sequence's capacity at MaxSeqLen+1 tokens (the
	// page-table row width of §4.3 before alignment) and AvailableTokens. It is
	// also the events' window_size.
	MaxSeqLen int

	// PageTableRows is the number of page-table rows (§4.3; see
	// PageTableRows()); 0 = unlimited. A cache needs a row; without a free
	// row PrepareContext returns false (KP-09).
	PageTableRows int
	// ReservedIndexSlots are rows only dummies may take: ordinary sequences
	// can hold at most PageTableRows − ReservedIndexSlots rows.
	ReservedIndexSlots int
	// MaxUtilForResume is the resume gate (§5.2); 0 means the default 0.97.
	MaxUtilForResume float64

	// EnableBlockReuse turns on radix-tree prefix reuse (§6). Off: no match,
	// no commit, no stored/removed events, and ReusePolicy() reports
	// PerRequest (history follows the context position).
	EnableBlockReuse bool
	// DisablePartialReuse stops a match at the last full block (§6.3 step 2
	// off; KR-03). The spec's default is partial reuse on.
	DisablePartialReuse bool
	// ReusePolicy says when blocks are committed (§7); zero = AllReusable.
	ReusePolicy scheduler.ReusePolicy
	// MaxNumTurns is the PER_CONVERSATION drop-plan depth; 0 means 1.
	MaxNumTurns int
	// CacheSalt returns the cache salt of a request ("" = none). Requests
	// with different salts never share blocks (§6.1). Nil: no salt. It must
	// be a pure function of the request.
	CacheSalt func(r *scheduler.Request) string

	// EventBufferMaxSize enables KV cache events when > 0 (§9); it is the
	// per-flush entry limit applied by LastEvents and EventPublisher.
	EventBufferMaxSize int
	// EventHash selects the block hash carried by events (§9.2).
	EventHash EventHashAlgo
	// AttentionDP marks an attention-DP deployment; events then carry
	// AttentionDPRank.
	AttentionDP     bool
	AttentionDPRank int

	// CP is the Helix context-parallel size; 0 or 1 = no Helix. Under Helix
	// the bookkeeping runs in global tokens with ledger block P·CP (§10).
	CP int
	// CPRank is this rank's index in the CP group, in [0, CP).
	CPRank int
}

// errHelixOption is wrapped by the Helix construction guards (§10.1).
var errHelixOption = errors.New("not supported with aggregated Helix")

// validate checks the configuration; the error names the offending field.
func (c Config) validate() error {
	switch {
	case c.NumPages <= 0:
		return fmt.Errorf("kvpool: NumPages must be positive, got %d", c.NumPages)
	case c.NumPages > MaxPages:
		return fmt.Errorf("kvpool: NumPages must be at most %d (int32 page indices), got %d", MaxPages, c.NumPages)
	case c.TokensPerPage <= 0:
		return fmt.Errorf("kvpool: TokensPerPage must be positive, got %d", c.TokensPerPage)
	case c.HostPages < 0:
		return fmt.Errorf("kvpool: HostPages must not be negative (0 = no host tier), got %d", c.HostPages)
	case c.HostPages > MaxPages:
		return fmt.Errorf("kvpool: HostPages must be at most %d, got %d", MaxPages, c.HostPages)
	case c.MaxSeqLen < 0:
		return fmt.Errorf("kvpool: MaxSeqLen must not be negative (0 = unlimited), got %d", c.MaxSeqLen)
	case c.PageTableRows < 0 || c.ReservedIndexSlots < 0:
		return fmt.Errorf("kvpool: PageTableRows (%d) and ReservedIndexSlots (%d) must not be negative",
			c.PageTableRows, c.ReservedIndexSlots)
	case c.PageTableRows > 0 && c.ReservedIndexSlots >= c.PageTableRows:
		return fmt.Errorf("kvpool: ReservedIndexSlots %d leaves no admissible row of %d", c.ReservedIndexSlots, c.PageTableRows)
	case c.MaxUtilForResume < 0 || c.MaxUtilForResume > 1:
		return fmt.Errorf("kvpool: MaxUtilForResume must be in (0, 1] (0 = default 0.97), got %g", c.MaxUtilForResume)
	case c.MaxNumTurns < 0:
		return fmt.Errorf("kvpool: MaxNumTurns must not be negative (0 = 1), got %d", c.MaxNumTurns)
	case c.ReusePolicy < scheduler.AllReusable || c.ReusePolicy > scheduler.PerConversation:
		return fmt.Errorf("kvpool: unknown ReusePolicy %d", c.ReusePolicy)
	case c.EventBufferMaxSize < 0:
		return fmt.Errorf("kvpool: EventBufferMaxSize must not be negative (0 = events off), got %d", c.EventBufferMaxSize)
	case c.EventHash != HashSHA256_64 && c.EventHash != HashSHA256:
		return fmt.Errorf("kvpool: unknown EventHash %d", c.EventHash)
	case c.CP < 0 || (c.CP > 1 && (c.CPRank < 0 || c.CPRank >= c.CP)):
		return fmt.Errorf("kvpool: CPRank %d out of range for CP %d", c.CPRank, c.CP)
	}
	if c.CP > 1 {
		// Guards of kvcache.md §10.1, before any collective.
		switch {
		case c.EnableBlockReuse:
			return fmt.Errorf("kvpool: EnableBlockReuse (a ledger block's bytes span CP ranks): %w", errHelixOption)
		case c.HostPages > 0:
			return fmt.Errorf("kvpool: HostPages %d (aggregated Helix does not support a host cache tier): %w", c.HostPages, errHelixOption)
		case c.AttentionDP:
			return fmt.Errorf("kvpool: AttentionDP: %w", errHelixOption)
		}
	}
	return nil
}

// MaxPages bounds page counts so that every page index fits an int32 (the
// engine's block-table element type).
const MaxPages = 1<<31 - 1

// defaultMaxUtilForResume is the spec default of max_util_for_resume.
const defaultMaxUtilForResume = 0.97

// cp is the Helix CP size, 1 without Helix.
func (c Config) cp() int { return max(1, c.CP) }

// ledgerBlock is the bookkeeping unit in (global) tokens: P, or P·cp under
// Helix (§10.1). One ledger block costs one page on this rank.
func (c Config) ledgerBlock() int { return c.TokensPerPage * c.cp() }

// maxBlocksPerSeq is the page-table row width of kvcache.md §4.3:
// ceil((MaxSeqLen+1)/ledger block) rounded up to a multiple of 4; 0 when
// unlimited.
func (c Config) maxBlocksPerSeq() int {
	if c.MaxSeqLen == 0 {
		return 0
	}
	return (ceilDiv(c.MaxSeqLen+1, c.ledgerBlock()) + 3) / 4 * 4
}

// PageTableRows is the number of page-table rows of kvcache.md §4.3:
// maxBatchSize·(2 with the overlap loop, else 1) + reservedIndexSlots. The
// admissible sequences are the rows minus the reserved slots.
func PageTableRows(maxBatchSize int, overlap bool, reservedIndexSlots int) int {
	perBatch := 1
	if overlap {
		perBatch = 2
	}
	return maxBatchSize*perBatch + reservedIndexSlots
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }
