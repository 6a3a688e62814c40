package executor

import (
	"fmt"
	"math"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// MaxSequenceTokens is the longest sequence (prompt + generated tokens) any
// rank can hold: token ids, positions and lengths cross the engine boundary
// and the arrival broadcast as 32-bit values.
const MaxSequenceTokens = math.MaxInt32

// Admission is arrival validation reduced to what it reads: a request's
// prompt length and generation limit, and this configuration. Because it
// needs no tokens, the length check runs before a request's tokens exist —
// rank 0 screens every arrival before it synthesises or broadcasts it, and
// the worker can refuse, before any rank starts, a trace in which no
// request could ever be served. The owning rank runs the same check again
// at admission (executor.md §3 step 4), with the same answer.
type Admission struct {
	// Pages is the number of device pages of a rank (ledger blocks).
	Pages int
	// LedgerBlockTokens is the tokens of one ledger block: the page size, or
	// page size × cp under Helix (so Pages × LedgerBlockTokens is the pool
	// in global tokens).
	LedgerBlockTokens int
	// MaxSeqLen bounds prompt + 1 (global tokens under Helix); 0 = unset,
	// the pool bounds the sequence instead.
	MaxSeqLen int
	// Scheduler supplies the rules for requests that can never be scheduled
	// (ChunkedContext, MaxNumTokens, Policy are read).
	Scheduler scheduler.Config
}

// NeverFits returns why a request of promptLen tokens that may generate up
// to maxNewTokens can never be served under a, or "" if it may be. Lengths
// may be anything an int holds: the comparisons are ordered so that none
// overflows.
func (a Admission) NeverFits(promptLen, maxNewTokens int) string {
	sc := a.Scheduler
	pool := a.Pages * a.LedgerBlockTokens
	switch {
	case promptLen < 1:
		return "empty prompt"
	case maxNewTokens < 1:
		return "max_new_tokens must be at least 1"
	case promptLen > MaxSequenceTokens || maxNewTokens > MaxSequenceTokens-promptLen:
		return fmt.Sprintf("prompt of %d tokens + max_new_tokens %d exceeds the int32 token range (%d tokens per sequence)",
			promptLen, maxNewTokens, MaxSequenceTokens)
	case !sc.ChunkedContext && sc.MaxNumTokens != scheduler.Unlimited && promptLen > sc.MaxNumTokens:
		return fmt.Sprintf("prompt of %d tokens exceeds max_num_tokens %d and chunked prefill is off", promptLen, sc.MaxNumTokens)
	case a.MaxSeqLen > 0 && promptLen+1 > a.MaxSeqLen:
		return fmt.Sprintf("prompt of %d tokens + 1 exceeds max_seq_len %d", promptLen, a.MaxSeqLen)
	case sc.Policy == scheduler.GuaranteedNoEvict && a.pagesToCompletion(promptLen, maxNewTokens) > a.Pages:
		return fmt.Sprintf("needs %d pages to completion, the pool has %d", a.pagesToCompletion(promptLen, maxNewTokens), a.Pages)
	case promptLen+maxNewTokens > pool:
		return fmt.Sprintf("prompt %d + max_new_tokens %d = %d tokens can never fit the KV pool of %d tokens (%d pages × %d)",
			promptLen, maxNewTokens, promptLen+maxNewTokens, pool, a.Pages, a.LedgerBlockTokens)
	}
	return ""
}

// pagesToCompletion is KV.PagesToCompletion from lengths alone:
// ceil((prompt + max_new) / ledger block). The caller has bounded the sum.
func (a Admission) pagesToCompletion(promptLen, maxNewTokens int) int {
	return (promptLen + maxNewTokens + a.LedgerBlockTokens - 1) / a.LedgerBlockTokens
}
