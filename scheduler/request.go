// Package scheduler is the per-rank KV-cache-V2 scheduling core
// (shared/spec/scheduler.md). It is pure: no I/O, no clock, no randomness, no
// goroutines, no logging globals. A pass is a deterministic function of the
// active list, the executing set, the configuration and the KV manager's
// answers, so every rank given the same inputs reaches the same plan.
package scheduler

// State is a request's scheduling state (spec §2.1). Values follow the spec.
type State int

// Request states.
const (
	ContextInit          State = 10
	ContextInProgress    State = 11
	GenerationInProgress State = 13
	GenerationToComplete State = 14
	Complete             State = 20
)

// String names the state as the spec does.
func (s State) String() string {
	switch s {
	case ContextInit:
		return "CONTEXT_INIT"
	case ContextInProgress:
		return "CONTEXT_IN_PROGRESS"
	case GenerationInProgress:
		return "GENERATION_IN_PROGRESS"
	case GenerationToComplete:
		return "GENERATION_TO_COMPLETE"
	case Complete:
		return "COMPLETE"
	}
	return "STATE(?)"
}

// InWindow reports whether the state is schedulable:
// CONTEXT_INIT ≤ state < GENERATION_TO_COMPLETE.
func (s State) InWindow() bool { return s >= ContextInit && s < GenerationToComplete }

// IsContext reports CONTEXT_INIT or CONTEXT_IN_PROGRESS.
func (s State) IsContext() bool { return s == ContextInit || s == ContextInProgress }

// UnsetEstimate marks a request without an uncached-prefill estimate.
const UnsetEstimate int64 = -1

// NoBatchIndex marks a request without a device batch slot.
const NoBatchIndex = -1

// Request is the scheduler's view of one request (spec §2.2). The executor
// owns it; the scheduler reads it and writes ChunkSize and BatchIndex (and the
// KV manager writes ContextPosition when it claims a reused prefix).
type Request struct {
	ID    uint64
	State State

	// Tokens is the current prompt: the original prompt, plus the generated
	// tokens after a recompute reset. len(Tokens) == PromptLen. The KV manager
	// reads it for prefix matching and block keys.
	Tokens []int32
	// PromptLen is the number of tokens of the current prompt.
	PromptLen int
	// ContextPosition is the number of prompt tokens already in KV (reused
	// prefix plus executed chunks).
	ContextPosition int
	// ChunkSize is written by the scheduler: tokens of the chunk scheduled this pass.
	ChunkSize int
	// MaxNewTokens is the generation limit of the current prompt.
	MaxNewTokens int
	// Generated counts tokens generated since the current prompt was set
	// (the first one is sampled by the last context chunk).
	Generated int

	// UncachedEstimate is the router's uncached-prefill estimate; UnsetEstimate if none.
	UncachedEstimate int64
	// ConversationID groups turns of one conversation ("" if unknown).
	ConversationID string
	// BatchIndex is the request's device batch slot; NoBatchIndex when not running.
	BatchIndex int
	// IsDummy marks a padding request; never a victim, never a response.
	IsDummy bool
	// Recomputed is set by the executor's recompute reset (executor.md
	// §11.2): the prompt holds the generated tokens too, so with chunking
	// off it may exceed M, and is then re-prefilled in chunks (rechunked).
	Recomputed bool
	// NoReuse: the KV manager claims no prefix from its radix tree for
	// this request, so every prompt position is computed (the prompt's
	// log-probabilities need every row's logits). Rank-invariant: it
	// comes with the arrival.
	NoReuse bool
	// KeyChain is the KV manager's cache of this prompt's block keys.
	KeyChain BlockKeyChain

	// Helix fields (kvcache.md §10); zero without Helix.
	TotalInputLenCP  int
	SeqLenThisRankCP int
	HelixDecodeCount int // g
	InactiveRank     bool
}

// Remaining is PromptLen − ContextPosition.
func (r *Request) Remaining() int { return r.PromptLen - r.ContextPosition }

// KVTokens is the number of tokens whose K/V a generation step needs in the
// cache once it ran: the prompt plus every generated token but the newest,
// plus the one being written by this step.
func (r *Request) KVTokens() int { return r.PromptLen + r.Generated }
