package kvpool

import (
	"errors"
	"fmt"
)

// Config sizes a Manager.
type Config struct {
	// NumPages is the number of device-tier pages (> 0).
	NumPages int
	// TokensPerPage is P, the tokens one page holds (> 0).
	TokensPerPage int
	// HostPages is the host-tier size in pages. It must be 0 in this cut.
	HostPages int
	// MaxSeqLen is the longest sequence in tokens; 0 means unlimited. It caps
	// a sequence's capacity (at MaxSeqLen+1 tokens, the page-table row width
	// of kvcache.md §4.3 before alignment) and AvailableTokens.
	MaxSeqLen int
}

// errHostTier is returned by New for a non-zero HostPages.
var errHostTier = errors.New("kvpool: host tier not supported yet (HostPages must be 0)")

// validate checks the configuration; the error names the offending field.
func (c Config) validate() error {
	switch {
	case c.NumPages <= 0:
		return fmt.Errorf("kvpool: NumPages must be positive, got %d", c.NumPages)
	case c.NumPages > maxPages:
		return fmt.Errorf("kvpool: NumPages must be at most %d (int32 page indices), got %d", maxPages, c.NumPages)
	case c.TokensPerPage <= 0:
		return fmt.Errorf("kvpool: TokensPerPage must be positive, got %d", c.TokensPerPage)
	case c.HostPages < 0:
		return fmt.Errorf("kvpool: HostPages must not be negative, got %d", c.HostPages)
	case c.HostPages > 0:
		return errHostTier
	case c.MaxSeqLen < 0:
		return fmt.Errorf("kvpool: MaxSeqLen must not be negative (0 = unlimited), got %d", c.MaxSeqLen)
	}
	return nil
}

// maxPages bounds NumPages so that every page index fits an int32 (the
// engine's block-table element type).
const maxPages = 1<<31 - 1

// maxBlocksPerSeq is the page-table row width of kvcache.md §4.3:
// ceil((MaxSeqLen+1)/P) rounded up to a multiple of 4; 0 when unlimited.
func (c Config) maxBlocksPerSeq() int {
	if c.MaxSeqLen == 0 {
		return 0
	}
	return (ceilDiv(c.MaxSeqLen+1, c.TokensPerPage) + 3) / 4 * 4
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }
