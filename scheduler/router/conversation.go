package router

import (
	"fmt"
	"math"
	"strings"
)

// Conversation is the conversation-aware router (spec §3): requests sharing
// a routing key (affinity id, else conversation id) stick to the rank that
// served the key first, so later turns find their prefix in that rank's KV
// cache; new keys and key-less requests are spread by round-robin,
// least-queued, least-tokens or least-prefill placement under a fair-share
// bound; no rank takes more than
// H requests unless the caller skipped the pop. While demotion is on it
// also publishes the uncached-prefill estimate (§5).
//
// State carried across calls (identical on every rank because every rank
// makes the same calls): the key → rank bindings (LRU, MaxSessions), the
// round-robin cursor and the conversation → previous prompt length history
// (LRU, MaxSessions; only while demotion or the load-balance weight is on).
type Conversation struct {
	capH         int
	multiplier   float64
	leastQueued  bool
	leastTokens  bool    // least_tokens or least_prefill: the fewest tokens in c.tokens
	leastPrefill bool    // least_prefill: c.tokens holds pending prefill, not prompt tokens
	weight       float64 // load_balance_weight (0: sticky always)
	demotion     bool
	notes        []string

	bind    *lru // routing key → rank
	history *lru // conversation id → previous prompt length
	rr      int  // round-robin cursor

	// Reused per call; see Result for their lifetime.
	count  []int
	order  []int
	rest   []int
	ranks  []int
	placed []int
	est    []int64
	tokens []int64 // least_tokens (least_prefill): each rank's prompt (pending prefill) tokens, with this call's placements
}

// NewConversation builds the conversation-aware router. An unknown
// NewConvPlacement falls back to round-robin and leaves one note.
func NewConversation(cfg Config) (*Conversation, error) {
	if err := cfg.validateCap(); err != nil {
		return nil, err
	}
	sessions := cfg.MaxSessions
	switch {
	case sessions == 0:
		sessions = DefaultMaxSessions
	case sessions < 0:
		return nil, fmt.Errorf("router: max_sessions must be at least 1, got %d", cfg.MaxSessions)
	}
	m := cfg.FairShareMultiplier
	switch {
	case math.IsNaN(m) || math.IsInf(m, 0):
		return nil, fmt.Errorf("router: fair_share_multiplier must be a finite number, got %v", m)
	case m == 0:
		m = DefaultFairShareMultiplier
	}
	w := cfg.LoadBalanceWeight
	if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
		return nil, fmt.Errorf("router: load_balance_weight must be a finite number ≥ 0, got %v", w)
	}
	c := &Conversation{
		capH:       cfg.MaxActivePerRank,
		multiplier: max(1.0, m),
		demotion:   cfg.Demotion,
		weight:     w,
		bind:       newLRU(sessions),
		history:    newLRU(sessions),
	}
	switch cfg.NewConvPlacement {
	case "", PlacementRoundRobin:
	case PlacementLeastQueued:
		c.leastQueued = true
	case PlacementLeastTokens:
		c.leastTokens = true
	case PlacementLeastPrefill:
		c.leastTokens, c.leastPrefill = true, true
	default:
		c.notes = append(c.notes, fmt.Sprintf("router: new_conv_placement %q is unknown; using %s (allowed: %s)",
			cfg.NewConvPlacement, PlacementRoundRobin, strings.Join(Placements, ", ")))
	}
	if w > 0 && !c.leastTokens {
		return nil, fmt.Errorf("router: load_balance_weight %v weighs a rank's tokens, so it needs new_conv_placement %s or %s, got %q",
			w, PlacementLeastTokens, PlacementLeastPrefill, cfg.NewConvPlacement)
	}
	return c, nil
}

// Name returns NameConversation.
func (c *Conversation) Name() string { return NameConversation }

// Notes returns the construction warnings (at most one: unknown placement).
func (c *Conversation) Notes() []string { return c.notes }

// Route implements Router (spec §3.2). items are the taken requests in pop
// order; estimates are computed in that order, before placement.
func (c *Conversation) Route(items []Item, states []RankState) Result {
	dp := len(states)
	c.count = grow(c.count, dp)
	var tokens []int64
	if c.leastTokens {
		c.tokens = grow(c.tokens, dp)
		tokens = c.tokens
	}
	rankVectors(states, c.count, tokens, c.leastPrefill)
	c.ranks = grow(c.ranks, len(items))
	c.placed = c.placed[:0]

	var est []int64
	if c.demotion || c.weight > 0 {
		c.est = grow(c.est, len(items))
		for i := range items {
			c.est[i] = c.estimate(&items[i])
		}
		if c.demotion {
			est = c.est // published only with demotion
		}
	}

	// Explicit pass: a bound key always waits for the sticky pass (its home
	// beats its target); an unbound target with room takes the item and
	// becomes the key's home.
	c.order = strictFirst(items, c.order)
	c.rest = c.rest[:0]
	for _, i := range c.order {
		k := items[i].routingKey()
		t := items[i].target(dp)
		if (k == "" || !c.bind.has(k)) && t >= 0 && c.count[t] < c.capH {
			c.place(items, i, t)
			if k != "" {
				c.bind.put(k, int64(t))
			}
			continue
		}
		c.rest = append(c.rest, i)
	}
	expected := expectedPerRank(c.count, len(c.rest), c.multiplier, c.capH)

	// Sticky beats balance: a key goes home while home has room. A full
	// home is not rebound, so the key returns once home drains.
	for _, i := range c.rest {
		k := items[i].routingKey()
		if k != "" {
			// home < dp always holds while dp is fixed; the check only keeps a
			// resized fleet from indexing out of range.
			if home, ok := c.bind.peek(k); ok && int(home) < dp && c.count[home] < c.capH {
				r := int(home)
				if c.weight > 0 {
					r = c.balanced(items, i, r, expected)
				}
				if r == int(home) {
					c.bind.touch(k)
				} else {
					c.bind.put(k, int64(r))
				}
				c.place(items, i, r)
				continue
			}
		}
		chosen := c.choose(expected)
		if k != "" && !c.bind.has(k) {
			c.bind.put(k, int64(chosen))
		}
		c.place(items, i, chosen)
	}
	for _, n := range c.count {
		expected = max(expected, n)
	}
	return Result{Ranks: c.ranks, Order: c.placed, Expected: expected, Estimates: est}
}

func (c *Conversation) place(items []Item, i, rank int) {
	c.ranks[i] = rank
	c.placed = append(c.placed, i)
	c.count[rank]++
	if c.leastTokens {
		c.tokens[rank] += int64(items[i].PromptLen)
	}
}

// choose picks a rank for a request without a usable home (spec §3.2).
func (c *Conversation) choose(expected int) int {
	if c.leastTokens {
		if r := c.leastTokenRank(expected); r >= 0 {
			return r
		}
		return c.leastTokenRank(int(^uint(0) >> 1))
	}
	if !c.leastQueued {
		dp := len(c.count)
		for range dp {
			r := c.rr
			c.rr = (c.rr + 1) % dp
			if c.count[r] < expected {
				return r
			}
		}
	}
	if r := leastCount(c.count, expected); r >= 0 {
		return r
	}
	return leastCount(c.count, int(^uint(0)>>1))
}

// balanced is load_balance_weight's choice for items[i], whose key's home
// has room: the rank minimising w·tokens(r) + the prompt it would prefill
// there (the uncached estimate at home, the whole prompt elsewhere); other
// ranks only below the fair share (expected) and the cap; home on ties,
// then the lowest rank.
func (c *Conversation) balanced(items []Item, i, home, expected int) int {
	best := home
	bestCost := c.weight*float64(c.tokens[home]) + float64(c.est[i])
	prompt := float64(items[i].PromptLen)
	for r, n := range c.count {
		if r == home || n >= expected || n >= c.capH {
			continue
		}
		if cost := c.weight*float64(c.tokens[r]) + prompt; cost < bestCost {
			best, bestCost = r, cost
		}
	}
	return best
}

// leastTokenRank is least_tokens' choice: among ranks with count < limit,
// the one with the fewest prompt tokens (ties: the lower count, then the
// lowest rank); -1 if there is none. With least_prefill the tokens are the
// ranks' pending prefill, so the same rule picks the fewest of those.
func (c *Conversation) leastTokenRank(limit int) int {
	best := -1
	for r, n := range c.count {
		if n >= limit {
			continue
		}
		if best < 0 || c.tokens[r] < c.tokens[best] || c.tokens[r] == c.tokens[best] && n < c.count[best] {
			best = r
		}
	}
	return best
}

// estimate is the uncached-prefill estimate of §5 for one taken item, with
// its history update. History is keyed by conversation id, never by the
// routing key, so sub-agents sharing an affinity id keep separate histories.
func (c *Conversation) estimate(it *Item) int64 {
	p := int64(it.PromptLen)
	if it.ConversationID == "" {
		return p
	}
	prev, ok := c.history.peek(it.ConversationID)
	c.history.put(it.ConversationID, p)
	if ok && p >= prev {
		return p - prev // growth since the previous turn's prompt
	}
	return p // first turn, evicted, or a rewritten (shrunk) conversation
}
