package scheduler

import (
	"fmt"
	"math"
)

// Admission verdicts, in the manner of the Kubernetes scheduler's status
// codes: a request is either served now, served once pages free up, or can
// never be served by this configuration. The last is answered at once with
// a reason instead of being retried for ever. Every place that asks "can
// this request ever run here" asks Admission: rank 0's arrival screen (from
// lengths alone, before the tokens exist), the owning rank's admission
// (executor.md §3 step 4), the HTTP server (413), the worker's up-front
// check and the dry run. The scheduler's recompute-victim predicate reads
// the one rule that depends on a request's current prompt (CanPrefill).

// MaxSequenceTokens is the longest sequence (prompt + generated tokens) any
// rank can hold: token ids, positions and lengths cross the engine boundary
// and the arrival broadcast as 32-bit values.
const MaxSequenceTokens = math.MaxInt32

// AdmissionCode is the outcome of an admission verdict.
type AdmissionCode uint8

// Admission codes. The zero value is Fits.
const (
	// Fits: the request can be served (and, for VerdictNow, the pages it
	// needs are available now).
	Fits AdmissionCode = iota
	// WaitForPages: the request fits the pool but not the pages available
	// right now (VerdictNow only). It is admitted and waits (CONTEXT_INIT) until the scheduler
	// finds its pages; it is never rejected for it.
	WaitForPages
	// NeverFits: no state of the pool can ever serve the request under this
	// configuration; it is rejected at once with the reason.
	NeverFits
)

// String names the code.
func (c AdmissionCode) String() string {
	switch c {
	case Fits:
		return "Fits"
	case WaitForPages:
		return "WaitForPages"
	case NeverFits:
		return "NeverFits"
	}
	return "AdmissionCode(?)"
}

// AdmissionRule names the rule that decided a verdict, so that a caller
// can say where the user set what failed (a flag, a dry-run field).
type AdmissionRule uint8

// Admission rules, in the order Verdict applies them.
const (
	// RuleNone: no rule objected (Fits).
	RuleNone AdmissionRule = iota
	// RuleEmptyPrompt: the prompt has no token.
	RuleEmptyPrompt
	// RuleMaxNewTokens: the request may not generate a token.
	RuleMaxNewTokens
	// RuleTokenRange: prompt + max_new_tokens exceeds MaxSequenceTokens.
	RuleTokenRange
	// RuleUnchunkedPrompt: chunked prefill is off and the prompt exceeds
	// max_num_tokens (Config.CanPrefill).
	RuleUnchunkedPrompt
	// RuleMaxSeqLen: prompt + 1 exceeds max_seq_len.
	RuleMaxSeqLen
	// RulePagesToCompletion: under GUARANTEED_NO_EVICT the request's
	// reservation to completion exceeds the pool.
	RulePagesToCompletion
	// RulePoolTokens: prompt + max_new_tokens exceeds the pool's tokens.
	RulePoolTokens
	// RuleAvailablePages: the pages the request needs are not available now
	// (WaitForPages).
	RuleAvailablePages
)

// AdmissionVerdict is an admission decision: its code, the rule that
// decided it and, unless it Fits, the reason for the user. The zero value
// is Fits.
type AdmissionVerdict struct {
	Code AdmissionCode
	// Rule is the rule that decided (RuleNone when Code is Fits).
	Rule AdmissionRule
	// Reason says why, in words a user can act on ("" when Code is Fits).
	// Tests and users match these texts: they do not change.
	Reason string
}

// Admission is arrival validation reduced to what it reads: a request's
// prompt length and generation limit, and this configuration. Because it
// needs no tokens, the check runs before a request's tokens exist: rank 0
// screens every arrival before it synthesises or broadcasts it, and the
// worker can refuse, before any rank starts, a trace in which no request
// could ever be served. The owning rank runs the same check again at
// admission (executor.md §3 step 4), with the same answer.
type Admission struct {
	// Pages is the number of device pages of a rank (ledger blocks).
	Pages int
	// LedgerBlockTokens is the tokens of one ledger block: the page size, or
	// page size × cp under Helix (so Pages × LedgerBlockTokens is the pool
	// in global tokens).
	LedgerBlockTokens int
	// MaxSeqLen bounds prompt + 1 (global tokens under Helix); 0 = unset,
	// the pool bounds the sequence instead (the dry run has none).
	MaxSeqLen int
	// Scheduler supplies the rules for requests that can never be scheduled
	// (ChunkedContext, MaxNumTokens, Policy are read).
	Scheduler Config
}

// Verdict applies the rules that do not depend on the pool's state to a
// request of promptLen tokens that may generate up to maxNewTokens: the
// answer is Fits or NeverFits. Lengths may be anything an int holds: the
// comparisons are ordered so that none overflows.
func (a Admission) Verdict(promptLen, maxNewTokens int) AdmissionVerdict {
	sc := &a.Scheduler
	pool := a.Pages * a.LedgerBlockTokens
	never := func(rule AdmissionRule, format string, args ...any) AdmissionVerdict {
		return AdmissionVerdict{Code: NeverFits, Rule: rule, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case promptLen < 1:
		return never(RuleEmptyPrompt, "empty prompt")
	case maxNewTokens < 1:
		return never(RuleMaxNewTokens, "max_new_tokens must be at least 1")
	case promptLen > MaxSequenceTokens || maxNewTokens > MaxSequenceTokens-promptLen:
		return never(RuleTokenRange, "prompt of %d tokens + max_new_tokens %d exceeds the int32 token range (%d tokens per sequence)",
			promptLen, maxNewTokens, MaxSequenceTokens)
	case !sc.CanPrefill(promptLen):
		return never(RuleUnchunkedPrompt, "prompt of %d tokens exceeds max_num_tokens %d and chunked prefill is off",
			promptLen, sc.MaxNumTokens)
	case a.MaxSeqLen > 0 && promptLen+1 > a.MaxSeqLen:
		return never(RuleMaxSeqLen, "prompt of %d tokens + 1 exceeds max_seq_len %d", promptLen, a.MaxSeqLen)
	}
	maxNewTokens = a.NewTokens(promptLen, maxNewTokens)
	switch {
	case !a.reservationFits(promptLen, maxNewTokens):
		need, _ := a.ReservationFits(promptLen, maxNewTokens)
		return never(RulePagesToCompletion, "needs %d pages to completion, the pool has %d", need, a.Pages)
	case promptLen+maxNewTokens > pool:
		return never(RulePoolTokens, "prompt %d + max_new_tokens %d = %d tokens can never fit the KV pool of %d tokens (%d pages × %d)",
			promptLen, maxNewTokens, promptLen+maxNewTokens, pool, a.Pages, a.LedgerBlockTokens)
	}
	return AdmissionVerdict{}
}

// NewTokens is how many tokens a request of promptLen tokens asking for
// maxNewTokens may generate: all of them, or, when the sequence would
// outgrow max_seq_len, max_seq_len − promptLen (at least 1 for a prompt
// Verdict admits). The executor cuts every arrival's max_new_tokens to it,
// as TensorRT-LLM's request validation does (with a warning), and Verdict
// judges the cut request; before, the sequence ran into the KV pool's
// max_seq_len cap while decoding and the pass stalled (MAX_UTILIZATION) or
// a reservation was violated (GUARANTEED_NO_EVICT).
func (a Admission) NewTokens(promptLen, maxNewTokens int) int {
	if a.MaxSeqLen > 0 && promptLen < a.MaxSeqLen && maxNewTokens > a.MaxSeqLen-promptLen {
		return a.MaxSeqLen - promptLen
	}
	return maxNewTokens
}

// VerdictNow is Verdict against a pool that could allocate availablePages
// pages now (free pages, plus cached ones it may evict, less
// reservations): a request that can be served but whose pages are not
// available gets WaitForPages. The pages it needs are its reservation to
// completion under GUARANTEED_NO_EVICT (its first chunk takes it whole),
// otherwise the pages of its whole prompt (an upper bound: a chunk can
// start with fewer, and a reused prefix needs none).
func (a Admission) VerdictNow(promptLen, maxNewTokens, availablePages int) AdmissionVerdict {
	v := a.Verdict(promptLen, maxNewTokens)
	if v.Code != Fits || a.LedgerBlockTokens < 1 {
		return v
	}
	need := a.pagesToCompletion(promptLen, 0)
	if a.Scheduler.Policy == GuaranteedNoEvict {
		need = a.pagesToCompletion(promptLen, maxNewTokens)
	}
	if need > availablePages {
		return AdmissionVerdict{Code: WaitForPages, Rule: RuleAvailablePages,
			Reason: fmt.Sprintf("needs %d pages, %d of %d are available now", need, max(0, availablePages), a.Pages)}
	}
	return v
}

// ReservationFits reports whether a request's reservation to completion
// fits the pool under GUARANTEED_NO_EVICT (it always does under
// MAX_UTILIZATION, which reserves nothing), and the pages it needs. The
// caller has bounded promptLen + maxNewTokens (RuleTokenRange).
func (a Admission) ReservationFits(promptLen, maxNewTokens int) (needPages int, ok bool) {
	need := a.pagesToCompletion(promptLen, maxNewTokens)
	return need, a.Scheduler.Policy != GuaranteedNoEvict || need <= a.Pages
}

func (a Admission) reservationFits(promptLen, maxNewTokens int) bool {
	_, ok := a.ReservationFits(promptLen, maxNewTokens)
	return ok
}

// pagesToCompletion is KV.PagesToCompletion from lengths alone:
// ceil((prompt + max_new) / ledger block). The caller has bounded the sum.
func (a Admission) pagesToCompletion(promptLen, maxNewTokens int) int {
	return (promptLen + maxNewTokens + a.LedgerBlockTokens - 1) / a.LedgerBlockTokens
}

// CanPrefill reports whether a prompt of promptLen tokens can ever be
// prefilled under c: chunked prefill is on, the token budget is unlimited,
// or the whole prompt fits one pass's max_num_tokens. It is admission's
// RuleUnchunkedPrompt (a recompute-reset prompt that outgrew M is
// re-prefilled in chunks instead: Scheduler.rechunked).
func (c *Config) CanPrefill(promptLen int) bool {
	return c.ChunkedContext || c.MaxNumTokens == Unlimited || promptLen <= c.MaxNumTokens
}
