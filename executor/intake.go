package executor

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// Intake (DESIGN.md §2 step 1; executor.md §3 step 2): rank 0 reads the
// arrivals its Source has due, screens them (scheduler.Admission) and broadcasts them
// with the shutdown flag and the cancellations; every rank appends them to
// its waiting queue in broadcast order.

// Arrival is one new request as broadcast from rank 0 to every rank.
type Arrival struct {
	ID             uint64 // request id (the trace index)
	ArrivalUnixNS  int64  // when the request arrived (wall clock)
	MaxNewTokens   int
	ConversationID string
	// Routing is the optional attention-DP routing (affinity id, target
	// rank, strictness); every rank routes with it, so it is broadcast.
	Routing workload.Routing
	// StopAtEOS ends generation at the model's stop tokens
	// (Config.StopTokens) as well as at MaxNewTokens. Trace replays leave it
	// off: their output lengths are part of the workload.
	StopAtEOS bool
	// Sampling is how the request's tokens are drawn (the zero value is
	// greedy). A request's tokens depend only on its prompt, its Sampling
	// (Seed included) and the positions it samples (docs/sampling.md), so
	// they are the same on any rank count, batch, chunking or preemption.
	// Rank 0 rejects invalid parameters before the broadcast.
	Sampling bridge.SamplingParams
	// LogitBias is added to the request's logits before every pick
	// (bridge.SeqStep.LogitBias); ids must be in the model's vocabulary.
	LogitBias []bridge.TokenBias
	// StopTokenIDs end generation when sampled (the token is kept), as
	// the model's stop tokens do with StopAtEOS, whatever StopAtEOS says.
	StopTokenIDs []int32
	// Logprobs asks for every generated token's log-probability and the
	// TopLogprobs (0..bridge.MaxLogprobs) most probable tokens' at its
	// position (Response.Logprobs, TokenDelta.Logprob); they never change
	// the tokens.
	Logprobs    bool
	TopLogprobs int
	// PromptLogprobs asks for the log-probability of every prompt token
	// but the first, given the tokens before it, and the
	// PromptTopLogprobs (0..bridge.MaxLogprobs) most probable tokens' at
	// its position (vLLM's prompt_logprobs; Response.PromptLogprobs). The
	// request then reuses no cached prefix: every prompt row is computed.
	PromptLogprobs    bool
	PromptTopLogprobs int
	// Priority orders the waiting queue and the active list (vLLM's
	// priority scheduling: lower values first, arrival order among
	// equals): a request is routed and admitted ahead of less urgent
	// waiting ones, scheduled ahead of less urgent active ones, and
	// preemption takes its victims from the least urgent. 0 for every
	// request is first come, first served.
	Priority int32
	// Guide, when not empty, is a regular expression (Go's RE2 syntax) the
	// whole output must match (structured outputs; the structured
	// package): before every pick only the tokens that keep the output a
	// prefix of a match are allowed, the model's stop tokens only once it
	// is a match, and generation ends (Response.Stopped) when nothing can
	// extend the match. It needs Config.Guides.
	Guide string
	// MinTokens is how many tokens are generated before a stop token (the
	// model's with StopAtEOS, or StopTokenIDs) may be picked: until then
	// they are masked out (vLLM's min_tokens). A guide that can only end
	// overrides it. At most MaxNewTokens.
	MinTokens int
	// AllowedTokenIDs, when not empty, are the only tokens a pick may
	// return (vLLM's allowed_token_ids; within the model's vocabulary). A
	// guide's mask is restricted to them, unless they share no token.
	AllowedTokenIDs []int32
	// BadWords are token sequences never generated (vLLM's bad_words, as
	// the server tokenizes them): the last token of each is masked out of
	// a pick that follows the rest of it (a one-token sequence always).
	BadWords [][]int32
	// Prompt is the prompt's tokens. A source may leave it nil and set
	// PromptLen and Synthesize instead: rank 0 then checks the lengths
	// (scheduler.Admission) and calls Synthesize only for a request that can be
	// served, so a request too long to serve never has its tokens made.
	Prompt []int32
	// PromptLen is the prompt length when Prompt is nil (ignored otherwise).
	PromptLen int
	// Synthesize returns the PromptLen tokens of a lazy prompt. On rank 0
	// it runs only for a request that can be served; on the other ranks it
	// decodes the broadcast tokens when the request is admitted there. It
	// never crosses the wire (the broadcast carries Prompt).
	Synthesize func() []int32
}

// promptLen is the prompt length, whether the tokens exist yet or not.
func (a *Arrival) promptLen() int {
	if a.Prompt != nil || a.Synthesize == nil {
		return len(a.Prompt)
	}
	return a.PromptLen
}

// Source hands rank 0 the requests that have arrived. Implementations are
// used by rank 0's loop goroutine only.
type Source interface {
	// Due returns the requests that arrived by now, in arrival order.
	Due(now time.Time) []Arrival
	// Exhausted reports that no request will ever be due again.
	Exhausted() bool
	// NextArrival is when the next request arrives (zero if exhausted).
	NextArrival() time.Time
	// Total is the number of requests the source will ever produce.
	Total() int
}

// ArrivalWaiter is a Source whose requests come at unknown times (a
// server's). An idle rank 0 then waits in WaitArrival, which returns as soon
// as a request (or a withdrawal, or the end of the source) comes, or after d,
// instead of sleeping until NextArrival: the fleet needs no short idle
// period to answer a new request at once, and an idle server stays off the
// CPU.
type ArrivalWaiter interface {
	WaitArrival(d time.Duration)
}

// TraceSource replays trace requests at their arrival times: request i
// arrives at start + reqs[i].Arrival (the workload package has scaled and
// bounded it). Prompts are lazy: a request's tokens are synthesised only
// once rank 0 has found that it can be served.
type TraceSource struct {
	reqs  []workload.Request
	start time.Time
	next  int
}

// NewTraceSource starts the replay clock at start.
func NewTraceSource(reqs []workload.Request, start time.Time) *TraceSource {
	return &TraceSource{reqs: reqs, start: start}
}

func (s *TraceSource) at(i int) time.Time { return s.start.Add(s.reqs[i].Arrival) }

// Due implements Source.
func (s *TraceSource) Due(now time.Time) []Arrival {
	var out []Arrival
	for s.next < len(s.reqs) && !s.at(s.next).After(now) {
		r := &s.reqs[s.next]
		a := Arrival{
			ID:             uint64(r.Index),
			ArrivalUnixNS:  s.at(s.next).UnixNano(),
			MaxNewTokens:   r.MaxNewTokens,
			ConversationID: r.ConversationID,
			Routing:        r.Routing,
			StopAtEOS:      r.StopAtEOS,
			Logprobs:       r.Logprobs,
			PromptLogprobs: r.PromptLogprobs, PromptTopLogprobs: r.PromptTopLogprobs,
			TopLogprobs: r.TopLogprobs,
		}
		if r.Prompt != nil {
			a.Prompt = r.Prompt
		} else {
			a.PromptLen, a.Synthesize = r.PromptLen, r.Tokens
		}
		out = append(out, a)
		s.next++
	}
	return out
}

// Exhausted implements Source.
func (s *TraceSource) Exhausted() bool { return s.next >= len(s.reqs) }

// NextArrival implements Source.
func (s *TraceSource) NextArrival() time.Time {
	if s.Exhausted() {
		return time.Time{}
	}
	return s.at(s.next)
}

// Total implements Source.
func (s *TraceSource) Total() int { return len(s.reqs) }

// fetchArrivals is C2/C3: rank 0 broadcasts the count (and the shutdown
// flag), then the items only if the count is non-zero. Under attention DP
// the same header and items ride rank 0's rank state instead
// (gatherStatesAndArrivals).
func (e *Executor) fetchArrivals(now time.Time) ([]Arrival, error) {
	var items []Arrival
	var cancels []uint64
	var shut bool
	if e.cfg.Rank == 0 {
		items, cancels, shut = e.takeArrivals(now)
	}
	if !e.multi() {
		e.shutdown = e.shutdown || shut
		e.cancelRequests(cancels)
		return items, nil
	}
	hdr := e.appendIntakeHeader(nil, len(items), shut, len(cancels))
	t := e.waitStart()
	defer func() { e.waitEnd(t) }()
	got, err := e.d.Comm.Broadcast("arrival_count", 0, hdr)
	if err != nil {
		return nil, err
	}
	count, nc, err := e.applyIntakeHeader(got, true)
	if err != nil {
		return nil, err
	}
	if nc > 0 {
		raw, err := e.d.Comm.Broadcast("cancellations", 0, encodeIDs(cancels))
		if err != nil {
			return nil, err
		}
		if err := e.applyCancellations(raw, nc); err != nil {
			return nil, err
		}
	}
	if count == 0 {
		return nil, nil
	}
	var payload []byte
	if e.cfg.Rank == 0 {
		payload = encodeArrivals(items)
	}
	if payload, err = e.d.Comm.Broadcast("arrivals", 0, payload); err != nil {
		return nil, err
	}
	if e.cfg.Rank == 0 {
		return items, nil
	}
	return decodeArrivals(payload, count)
}

// maxKeptIntake is the largest intake buffer rank 0 keeps between
// iterations (bytes): a steady stream of arrivals reuses one, a burst's is
// given back.
const maxKeptIntake = 1 << 20

// gatherStatesAndArrivals is C1 with C2/C3 folded into it, under attention
// DP (where C1 runs in every iteration and world = tp): rank 0's rank state
// carries the arrival header, the cancelled ids and the items, so an
// iteration takes one collective where it took two or three. Every rank
// reads the same values at the same point of the iteration as from the
// broadcasts (the intake does not depend on the rank states, nor the rank
// states on the intake), so schedules and digests are unchanged. A
// deliberate difference from executor.md §7's inventory (issue 24 item 8).
func (e *Executor) gatherStatesAndArrivals(now time.Time) ([]Arrival, []RankState, error) {
	var items []Arrival
	var intake []byte
	if e.cfg.Rank == 0 {
		items, cancels, shut := e.takeArrivals(now)
		intake = e.appendIntakeHeader(e.intakeBuf[:0], len(items), shut, len(cancels))
		for _, id := range cancels {
			intake = binary.LittleEndian.AppendUint64(intake, id)
		}
		intake = appendArrivals(intake, items)
		// Keep the buffer for the next iteration, unless a burst of
		// prompts grew it: putRankState copies the intake, and a server
		// must not hold a burst's bytes for the rest of its life.
		if cap(intake) <= maxKeptIntake {
			e.intakeBuf = intake
		} else {
			e.intakeBuf = nil
		}
		states, _, err := e.gatherRankStates(intake)
		if err != nil {
			return nil, nil, err
		}
		// Rank 0 applies its own header as every rank does (shutdown,
		// cancellations, clock) and keeps its items.
		if _, err := e.applyIntake(intake); err != nil {
			return nil, nil, err
		}
		return items, states, nil
	}
	states, tail, err := e.gatherRankStates(nil)
	if err != nil {
		return nil, nil, err
	}
	items, err = e.applyIntake(tail)
	return items, states, err
}

// applyIntake applies the intake that rode rank 0's state: header, then
// the cancelled ids, then the items (decoded unless this is rank 0).
func (e *Executor) applyIntake(b []byte) ([]Arrival, error) {
	count, nc, err := e.applyIntakeHeader(b, false)
	if err != nil {
		return nil, err
	}
	b = b[e.intakeHeaderLen():]
	if len(b) < 8*nc {
		return nil, fmt.Errorf("collective desync: %d bytes of cancellations, want %d ids", len(b), nc)
	}
	if nc > 0 {
		if err := e.applyCancellations(b[:8*nc], nc); err != nil {
			return nil, err
		}
	}
	b = b[8*nc:]
	if count == 0 || e.cfg.Rank == 0 {
		if count == 0 && len(b) != 0 {
			return nil, fmt.Errorf("collective desync: %d bytes of arrivals, none announced", len(b))
		}
		return nil, nil
	}
	return decodeArrivals(b, count)
}

// takeArrivals is rank 0's intake: the arrivals due at now (screened), the
// cancellations, and whether the source is done.
func (e *Executor) takeArrivals(now time.Time) (items []Arrival, cancels []uint64, shut bool) {
	items = e.screenArrivals(e.d.Source.Due(now), now)
	if e.canceller != nil {
		cancels = e.canceller.Cancelled()
	}
	// Rejections made here are gathered at this iteration's C8; hold the
	// shutdown back one iteration so that the loop cannot exit first
	// (they are not fleet work: the other ranks never see them).
	shut = e.d.Source.Exhausted() && len(e.pending) == 0
	return items, cancels, shut
}

// intakeHeaderLen is the arrival header's size: arrivals, shutdown,
// cancellations, [rank 0's virtual clock] (configuration-dependent,
// identical on every rank).
func (e *Executor) intakeHeaderLen() int {
	if e.virtual != nil {
		return 32
	}
	return 24
}

// appendIntakeHeader appends the arrival header to b.
func (e *Executor) appendIntakeHeader(b []byte, count int, shut bool, cancels int) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(count))
	var s uint64
	if shut {
		s = 1
	}
	b = binary.LittleEndian.AppendUint64(b, s)
	b = binary.LittleEndian.AppendUint64(b, uint64(cancels))
	if e.virtual != nil {
		b = binary.LittleEndian.AppendUint64(b, uint64(e.vnow.UnixNano()))
	}
	return b
}

// applyIntakeHeader reads the arrival header at the start of got (exact:
// got is the header alone): the clock and the shutdown flag take effect,
// and it returns the announced arrivals and cancellations.
func (e *Executor) applyIntakeHeader(got []byte, exact bool) (count, cancels int, err error) {
	hdrLen := e.intakeHeaderLen()
	if len(got) < hdrLen || exact && len(got) != hdrLen {
		return 0, 0, fmt.Errorf("collective desync: arrival count of %d bytes", len(got))
	}
	if e.virtual != nil {
		e.vnow = time.Unix(0, int64(binary.LittleEndian.Uint64(got[24:])))
	}
	e.shutdown = e.shutdown || binary.LittleEndian.Uint64(got[8:]) != 0
	n, nc := binary.LittleEndian.Uint64(got), binary.LittleEndian.Uint64(got[16:])
	if nc > 1<<20 {
		return 0, 0, fmt.Errorf("collective desync: %d cancellations announced", nc)
	}
	if n > 1<<31 {
		return 0, 0, fmt.Errorf("collective desync: %d arrivals announced", n)
	}
	return int(n), int(nc), nil
}

// applyCancellations withdraws the nc cancelled ids of raw, on every rank,
// before this iteration schedules.
func (e *Executor) applyCancellations(raw []byte, nc int) error {
	ids, err := decodeIDs(raw, nc)
	if err != nil {
		return err
	}
	e.cancelRequests(ids)
	return nil
}

// screenArrivals is rank 0's length check before the broadcast: an arrival
// that can never be served anywhere (scheduler.Admission: every rank has the same
// pool and rules) gets its rejection in pendingResponses, with Rank NoRank,
// and is neither synthesised nor broadcast nor routed; a lazy prompt of the
// others is synthesised now. This extends executor.md §3 step 4, which the
// owning rank still runs after routing, so that a trace request of
// billions of tokens costs nothing and a length that does not fit the
// 32-bit wire format never reaches it.
func (e *Executor) screenArrivals(items []Arrival, now time.Time) []Arrival {
	if len(items) == 0 {
		return nil
	}
	kept := make([]Arrival, 0, len(items)) // the source may keep its slice: never write to it
	for _, a := range items {
		var reason string
		if v := e.adm.Verdict(a.promptLen(), a.MaxNewTokens); v.Code == scheduler.NeverFits {
			reason = v.Reason
		}
		if err := a.Sampling.Validate(); reason == "" && err != nil {
			reason = "invalid sampling parameters: " + err.Error()
		}
		// The source checks ids against the vocabulary (as it does the
		// prompt's); what can be checked without it is checked here.
		if err := bridge.ValidateBias(a.LogitBias, math.MaxInt32); reason == "" && err != nil {
			reason = "invalid logit bias: " + err.Error()
		}
		if reason == "" && slices.ContainsFunc(a.StopTokenIDs, func(t int32) bool { return t < 0 }) {
			reason = "invalid stop token ids: a negative id"
		}
		if err := a.validateLogprobs(); reason == "" && err != nil {
			reason = "invalid logprobs: " + err.Error()
		}
		if err := a.validatePromptLogprobs(); reason == "" && err != nil {
			reason = "invalid prompt logprobs: " + err.Error()
		}
		if reason == "" && a.Guide != "" {
			reason = e.screenGuide(a.Guide)
		}
		if reason == "" && len(a.AllowedTokenIDs) > 0 {
			vocab := e.d.Engine.Shape().VocabSize
			if i := slices.IndexFunc(a.AllowedTokenIDs, func(id int32) bool { return id < 0 || int(id) >= vocab }); i >= 0 {
				reason = fmt.Sprintf("invalid allowed token ids: %d is outside the vocabulary [0, %d)", a.AllowedTokenIDs[i], vocab)
			}
		}
		if reason == "" && len(a.BadWords) > 0 {
			vocab := e.d.Engine.Shape().VocabSize
			for j, w := range a.BadWords {
				if len(w) == 0 {
					reason = fmt.Sprintf("invalid bad words: word %d has no tokens", j)
				} else if i := slices.IndexFunc(w, func(id int32) bool { return id < 0 || int(id) >= vocab }); i >= 0 {
					reason = fmt.Sprintf("invalid bad words: word %d: token %d is outside the vocabulary [0, %d)", j, w[i], vocab)
				}
				if reason != "" {
					break
				}
			}
		}
		if reason == "" && (a.MinTokens < 0 || a.MinTokens > a.MaxNewTokens) {
			reason = fmt.Sprintf("invalid min_tokens %d: must be in [0, max_new_tokens %d]", a.MinTokens, a.MaxNewTokens)
		}
		if reason != "" {
			e.pending = append(e.pending, Response{ID: a.ID, Rank: NoRank, ArrivalUnixNS: a.ArrivalUnixNS,
				FinishUnixNS: max(now.UnixNano(), a.ArrivalUnixNS), Error: reason})
			continue
		}
		e.cutToMaxSeqLen(&a)
		if a.Prompt == nil && a.Synthesize != nil {
			a.Prompt = a.Synthesize()
			if len(a.Prompt) != a.PromptLen {
				panic(fmt.Sprintf("executor: arrival %d synthesised %d tokens, PromptLen says %d", a.ID, len(a.Prompt), a.PromptLen))
			}
		}
		a.Synthesize = nil
		kept = append(kept, a)
	}
	return kept
}

// screenGuide is the rejection reason of an arrival's guide ("" when it
// can run): the fleet must have the model's vocabulary, the pattern must
// compile, and some token must be able to begin a match.
func (e *Executor) screenGuide(pattern string) string {
	if e.cfg.Guides == nil {
		return "structured outputs need the model's vocabulary, and this fleet has no tokenizer"
	}
	g, err := e.cfg.Guides.Guide(pattern)
	if err != nil {
		return "invalid guide: " + err.Error()
	}
	if !g.NewMatcher().Live() {
		return "invalid guide: no token of the model's vocabulary can begin a match of its pattern"
	}
	return ""
}

// cutToMaxSeqLen cuts an arrival's max_new_tokens so that its sequence
// ends within max_seq_len (scheduler.Admission.NewTokens; the request then
// finishes by length there), with one warning for the run, as TensorRT-LLM
// warns for each request.
func (e *Executor) cutToMaxSeqLen(a *Arrival) {
	n := e.adm.NewTokens(a.promptLen(), a.MaxNewTokens)
	if n == a.MaxNewTokens {
		return
	}
	if !e.cutNoted && e.cfg.OnNote != nil {
		e.cutNoted = true
		e.cfg.OnNote(e.cfg.Rank, scheduler.Note{Level: scheduler.LevelWarn, Text: fmt.Sprintf(
			"request %d: prompt of %d tokens + max_new_tokens %d exceeds max_seq_len %d: max_new_tokens cut to %d "+
				"(further cuts are not logged)", a.ID, a.promptLen(), a.MaxNewTokens, e.adm.MaxSeqLen, n)})
	}
	a.MaxNewTokens = n
}
