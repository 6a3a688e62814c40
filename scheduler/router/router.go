// Package router assigns new requests to attention-DP ranks
// (shared/spec/router-and-calibration.md §1–§5).
//
// Every rank runs the same routing function on identical inputs: the
// gathered rank states and the broadcast new requests, in broadcast order.
// No decision is broadcast, so the package is pure and deterministic: no
// I/O, no clock, no randomness, no goroutines, no logging; no Go map is ever
// iterated to decide anything; every tie is broken by rank index or queue
// order; and every vector indexed by rank is filled from each state's Rank
// field, never from its position in the gathered list.
//
// One iteration on one rank:
//
//	taken, waiting = PopWaiting(waiting, states, H)   // §1.5
//	res := r.Route(taken, states)                      // §2 or §3 (+ §5 estimates)
//	for _, i := range res.Order { if res.Ranks[i] == myRank { activate(taken[i], res.Estimate(i)) } }
//
// A Router keeps state across calls (the conversation-aware router's
// bindings, round-robin cursor and prompt history), so every rank must feed
// its router exactly the same sequence of calls.
package router

import (
	"fmt"
	"math"
	"strings"
)

// UnsetEstimate marks an item without an uncached-prefill estimate. It
// equals scheduler.UnsetEstimate so that Result estimates can be copied into
// scheduler.Request.UncachedEstimate as they are.
const UnsetEstimate int64 = -1

// Item is the router's view of one new request (spec §1.4). The zero value
// of every routing field means "absent": no target rank, relaxed, no
// conversation, no affinity.
type Item struct {
	// ID identifies the request to the caller; the router only copies it.
	ID uint64
	// PromptLen is the original prompt length in tokens (at arrival).
	PromptLen int
	// HasTarget says whether Target is set (attention_dp_rank).
	HasTarget bool
	// Target is the requested rank; read only when HasTarget is true. A
	// target outside [0, number of ranks) is ignored, as if unset.
	Target int
	// Strict is attention_dp_relax == false. An unset relax flag is relaxed
	// (the project's deliberate difference from the reference), which is why
	// the field is Strict and not Relaxed: its zero value is the unset case.
	Strict bool
	// ConversationID keys the prompt history of the uncached estimate (§5)
	// and, without an AffinityID, the routing binding (§3).
	ConversationID string
	// AffinityID, when set, is the routing key shared by related
	// conversations (for example the sub-agents of one parent session).
	AffinityID string
}

// routingKey is AffinityID if set, else ConversationID, else "" (none).
func (it *Item) routingKey() string {
	if it.AffinityID != "" {
		return it.AffinityID
	}
	return it.ConversationID
}

// target returns the item's target rank, or -1 when it has none or names a
// rank outside [0, dp).
func (it *Item) target(dp int) int {
	if !it.HasTarget || it.Target < 0 || it.Target >= dp {
		return -1
	}
	return it.Target
}

// RankState is the router's view of one rank's gathered state (spec §1.2,
// fields 0–3). The executor converts its 13-value wire state into this.
type RankState struct {
	Rank             int   // the rank the state describes; vectors are indexed by it
	ActiveRequests   int   // counted requests: dummies and retiring ones excluded
	ActiveTokens     int64 // Σ original prompt lengths of the counted requests
	RetiringRequests int   // requests in GENERATION_TO_COMPLETE (informational)
	// PendingPrefill is Σ prompt tokens not yet in KV over the counted
	// requests (a waiting request counts its whole prompt until its first
	// chunk is admitted). Read only by least_prefill placement; the
	// executor gathers it only for a router that reads it
	// (ReadsPendingPrefill).
	PendingPrefill int64
}

// Result is the outcome of one Route call. Its slices belong to the router
// and stay valid only until the router's next Route call; copy what must
// outlive it.
type Result struct {
	// Ranks[i] is the rank items[i] was assigned to.
	Ranks []int
	// Order lists item indices in placement order. A rank activates its own
	// items in this order (for example explicit placements before balanced
	// ones), which is the order the spec's tables list per rank.
	Order []int
	// Expected is the per-rank request count the router balanced towards;
	// for the conversation-aware router it is at least every rank's final
	// count (sticky placement may exceed the fair share).
	Expected int
	// Estimates[i] is items[i]'s uncached-prefill estimate (§5), or nil when
	// the router publishes none (default router, or demotion off).
	Estimates []int64
}

// Estimate returns items[i]'s uncached-prefill estimate, or UnsetEstimate.
func (r Result) Estimate(i int) int64 {
	if r.Estimates == nil {
		return UnsetEstimate
	}
	return r.Estimates[i]
}

// ForRank appends to dst the indices of the items assigned to rank, in
// placement order, and returns it.
func (r Result) ForRank(rank int, dst []int) []int {
	for _, i := range r.Order {
		if r.Ranks[i] == rank {
			dst = append(dst, i)
		}
	}
	return dst
}

// Router assigns the requests taken from the waiting queue to ranks.
type Router interface {
	// Name is the router's selection name ("default" or "conversation").
	Name() string
	// Route assigns items (the taken requests, in pop order) given the
	// gathered states, one per rank 0..len(states)-1 in any order. It
	// panics when the states do not name every rank exactly once: that is a
	// collective desync the executor must have caught.
	Route(items []Item, states []RankState) Result
	// Notes are the configuration warnings found at construction (for
	// example an unknown placement); the caller logs them once.
	Notes() []string
}

var (
	_ Router = (*Default)(nil)
	_ Router = (*Conversation)(nil)
)

// Router names accepted by New.
const (
	NameDefault      = "default"
	NameConversation = "conversation"
)

// Placement names of Config.NewConvPlacement.
const (
	PlacementRoundRobin  = "round_robin"
	PlacementLeastQueued = "least_queued"
	// PlacementLeastTokens is TensorRT-LLM's least_tokens: the rank with
	// the fewest prompt tokens among its counted requests (ActiveTokens,
	// plus the prompts placed earlier in the same call).
	PlacementLeastTokens = "least_tokens"
	// PlacementLeastPrefill: the rank with the fewest prompt tokens still to
	// prefill (RankState.PendingPrefill, plus the prompts placed earlier in
	// the same call). The name is the one issue 25 gives for TensorRT-LLM's
	// KV-cache-aware ADP routing; its source was not found there, so the
	// rule is lockstep's own (docs/multi-rank.md).
	PlacementLeastPrefill = "least_prefill"
)

// Placements are the accepted NewConvPlacement names.
var Placements = []string{PlacementRoundRobin, PlacementLeastQueued, PlacementLeastTokens, PlacementLeastPrefill}

// ReadsPendingPrefill says whether r reads RankState.PendingPrefill (the
// conversation router with least_prefill placement): only then does the
// executor compute it and carry it in the rank-state gather.
func ReadsPendingPrefill(r Router) bool {
	c, ok := r.(*Conversation)
	return ok && c.leastPrefill
}

// Defaults of the conversation-aware router (spec §3.1).
const (
	DefaultMaxSessions         = 65536
	DefaultFairShareMultiplier = 2.0
)

// Config configures a router. Only MaxActivePerRank is read by the default
// router.
type Config struct {
	// MaxActivePerRank is H, max_num_active_requests: the per-rank hard cap.
	MaxActivePerRank int
	// MaxSessions bounds the routing bindings and the prompt history
	// (0 = DefaultMaxSessions).
	MaxSessions int
	// FairShareMultiplier is m (0 = DefaultFairShareMultiplier); values
	// below 1 are raised to 1.
	FairShareMultiplier float64
	// NewConvPlacement is PlacementRoundRobin (default, also for ""),
	// PlacementLeastQueued, PlacementLeastTokens or PlacementLeastPrefill;
	// any other value means round-robin with a note.
	NewConvPlacement string
	// LoadBalanceWeight w (conversation router; 0 = off, the spec's
	// sticky rule): a request whose key has a home goes to the rank r
	// that minimises w·load(r) + its uncached prompt there (the uncached
	// estimate at home, the whole prompt elsewhere), home on ties, under
	// the fair-share bound; it then becomes the key's home. load is the
	// placement's token measure, so w > 0 needs least_tokens or
	// least_prefill.
	LoadBalanceWeight float64
	// Demotion says long-prefill demotion is on (U > 0 and chunked context,
	// the scheduler's own predicate); only then are estimates published.
	Demotion bool
}

// NameFor maps conversation_affinity to a router name (spec §3.3).
func NameFor(conversationAffinity bool) string {
	if conversationAffinity {
		return NameConversation
	}
	return NameDefault
}

// New builds the router called name ("default" or "conversation").
func New(name string, cfg Config) (Router, error) {
	switch name {
	case NameDefault:
		return NewDefault(cfg)
	case NameConversation:
		return NewConversation(cfg)
	}
	return nil, fmt.Errorf("router %q is unknown; allowed values: %s", name,
		strings.Join([]string{NameDefault, NameConversation}, ", "))
}

func (c Config) validateCap() error {
	if c.MaxActivePerRank < 1 {
		return fmt.Errorf("router: max_num_active_requests must be at least 1, got %d", c.MaxActivePerRank)
	}
	return nil
}

// rankVectors fills count and tokens (length dp) from states by their Rank
// field: tokens from ActiveTokens, or from PendingPrefill when prefill is
// set. It panics unless the states name every rank 0..dp-1 exactly once.
func rankVectors(states []RankState, count []int, tokens []int64, prefill bool) {
	dp := len(states)
	if dp == 0 {
		panic("router: no rank states (the gather always holds at least this rank)")
	}
	for r := range count {
		count[r] = -1
	}
	for i := range states {
		s := &states[i]
		if s.Rank < 0 || s.Rank >= dp || count[s.Rank] >= 0 {
			panic(fmt.Sprintf("router: rank states must name ranks 0..%d exactly once (state %d names rank %d)", dp-1, i, s.Rank))
		}
		count[s.Rank] = s.ActiveRequests
		switch {
		case tokens == nil:
		case prefill:
			tokens[s.Rank] = s.PendingPrefill
		default:
			tokens[s.Rank] = s.ActiveTokens
		}
	}
}

// strictFirst fills order with 0..n-1, strict items first, each group in
// queue order (the stable sort of §1.6).
func strictFirst(items []Item, order []int) []int {
	order = order[:0]
	for i := range items {
		if items[i].Strict {
			order = append(order, i)
		}
	}
	for i := range items {
		if !items[i].Strict {
			order = append(order, i)
		}
	}
	return order
}

// expectedPerRank is the §1.6 helper: fair = ceil((Σ count + n) / dp),
// expected = min(max(ceil(m · fair), max count), H).
func expectedPerRank(count []int, n int, m float64, capH int) int {
	sum, most := 0, 0
	for _, c := range count {
		sum += c
		most = max(most, c)
	}
	dp := len(count)
	fair := (sum + n + dp - 1) / dp
	e := fair
	if m != 1 {
		e = int(math.Ceil(m * float64(fair)))
	}
	return min(max(e, most), capH)
}

// leastCount returns the rank with the lowest count among ranks with
// count < limit (ties: lowest rank), or -1 if there is none.
func leastCount(count []int, limit int) int {
	best := -1
	for r, c := range count {
		if c < limit && (best < 0 || c < count[best]) {
			best = r
		}
	}
	return best
}

// grow returns s resliced to n elements, reallocating only when needed.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// DemotionOn is the predicate under which estimates are published: long-
// prefill demotion is on when TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS > 0 and
// chunked context is enabled, the scheduler's own condition.
func DemotionOn(uncachedTokens int64, chunkedContext bool) bool {
	return uncachedTokens > 0 && chunkedContext
}
