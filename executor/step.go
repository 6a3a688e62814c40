package executor

import (
	"fmt"
	"slices"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/structured"
)

// batch is one launched forward: its requests in step order, which rows
// sample, and the iteration it belongs to (for its log record).
type batch struct {
	reqs   []*request
	sample []bool
	iter   int64
	// tokens is the batch's real tokens: its context chunks and one per
	// generation request, padding dummies not counted (the token balance).
	tokens int64
	start  time.Time // wall-clock start of the iteration that launched it
	rec    *IterRecord
	scores []scoredChunk // the context chunks that score their prompt rows
}

// scoredChunk is a context chunk of b.reqs[req] whose rows are scored
// (Arrival.PromptLogprobs): n rows from step row row, at prompt positions
// from pos.
type scoredChunk struct {
	req, row, pos, n int
}

// prepareBatch assigns batch slots and asserts that every scheduled request's
// cache is active (the scheduler already allocated, in both policies).
func (e *Executor) prepareBatch(out *scheduler.Output, p *plan) (*batch, error) {
	b := e.spare
	e.spare = nil
	if b == nil || b == e.prev {
		b = &batch{}
	}
	b.reqs, b.sample = b.reqs[:0], b.sample[:0]
	b.iter, b.start, b.rec = e.iter, p.wallStart, p.rec
	b.tokens = 0
	for _, s := range out.Context {
		b.tokens += int64(s.ChunkSize)
	}
	for _, s := range out.Generation {
		if !s.IsDummy {
			b.tokens++
		}
	}
	for _, list := range [][]*scheduler.Request{out.Context, out.Generation} {
		for _, s := range list {
			r := e.request(s.ID)
			if r == nil {
				return nil, fmt.Errorf("invariant prepareBatch: scheduled request %d is not active", s.ID)
			}
			if !e.d.KV.IsActive(r.ID) {
				return nil, fmt.Errorf("invariant prepareBatch: scheduled request %d has no active KV cache", r.ID)
			}
			r.BatchIndex = len(b.reqs)
			r.pending++
			b.reqs = append(b.reqs, r)
		}
	}
	return b, nil
}

// buildStep fills the step descriptor of b (one cgo call for the whole
// batch). It must run after the previous batch's tokens were applied: a
// generation row's input is the newest token of its request.
func (e *Executor) buildStep(b *batch) error {
	seqs := e.step.Seqs[:0]
	b.sample = b.sample[:0]
	b.scores = b.scores[:0]
	row := 0
	for i, r := range b.reqs {
		var s bridge.SeqStep
		switch {
		case r.State.IsContext():
			pos := r.ContextPosition
			s = bridge.SeqStep{Tokens: r.Tokens[pos : pos+r.ChunkSize], StartPos: pos,
				Sample: pos+r.ChunkSize == r.PromptLen}
			// A recomputed request's prompt was scored before its first
			// token: its rows are not scored again.
			if r.promptLP && len(r.output) == 0 && pos+1 < len(r.prompt) {
				s.ScoreTargets, s.ScoreTop = r.scoreTargets(pos, r.ChunkSize), r.promptTop
				b.scores = append(b.scores, scoredChunk{req: i, row: row, pos: pos, n: r.ChunkSize})
			}
		case r.IsDummy:
			s = bridge.SeqStep{Tokens: r.Tokens[:1], StartPos: 0}
		default:
			if len(r.output) == 0 {
				return fmt.Errorf("invariant buildStep: generation request %d has no token to feed", r.ID)
			}
			s = bridge.SeqStep{Tokens: r.output[len(r.output)-1:], StartPos: r.PromptLen + r.Generated - 1, Sample: true}
		}
		if s.Sample {
			s.Sampling, s.LogitBias = r.sampling, r.logitBias
			s.Allowed = e.pickMask(r)
			s.Logprobs, s.TopLogprobs = r.logprobs, r.topLogprobs
			if r.sampling.HasPenalties() {
				// Every token generated so far is applied (buildStep runs
				// after the previous batch's tokens): the same history on
				// every rank, batch and recompute.
				s.PromptTokens, s.OutputTokens = r.prompt, r.output
			}
		}
		s.BlockTable = e.d.KV.BlockTable(r.ID)
		row += len(s.Tokens)
		seqs = append(seqs, s)
		b.sample = append(b.sample, s.Sample)
	}
	e.step.Seqs = seqs
	return nil
}

// markLaunched applies the state transitions of a launch (§6 step 14): a
// context chunk advances the position (and a final chunk makes the request a
// generation request); a step that produces the last allowed token makes the
// request GENERATION_TO_COMPLETE.
func (e *Executor) markLaunched(b *batch) {
	for i, r := range b.reqs {
		if r.IsDummy {
			// A dummy runs once: it leaves the scheduler's window at launch.
			r.State = scheduler.GenerationToComplete
			continue
		}
		if r.State.IsContext() {
			if r.State == scheduler.ContextInit && !r.reusedSet {
				r.reused, r.reusedSet = r.ContextPosition, true // the claimed prefix, before the first chunk
				r.scheduledNS = e.cfg.Clock().UnixNano()
			}
			r.ContextPosition += r.ChunkSize
			e.d.KV.UpdateAfterContext(&r.Request)
			if !b.sample[i] {
				r.State = scheduler.ContextInProgress
				continue
			}
			r.State = scheduler.GenerationInProgress
		}
		if r.Generated+1 >= r.MaxNewTokens {
			r.State = scheduler.GenerationToComplete
		}
	}
}

// applyResults applies a finished batch's sampled tokens: outputs grow, a
// request whose last token arrived completes (KV freed, response queued), and
// the batch's dummies leave. It returns the batch's compute time: device
// time less the time spent waiting in MoE exchanges.
func (e *Executor) applyResults(b *batch, res *bridge.StepResult) (float64, error) {
	if len(res.Sampled) != len(b.reqs) {
		return 0, fmt.Errorf("engine returned %d sampled tokens for a batch of %d", len(res.Sampled), len(b.reqs))
	}
	now := e.cfg.Clock().UnixNano()
	removed := false
	if err := applyScores(b, res); err != nil {
		return 0, err
	}
	for i, r := range b.reqs {
		if r.IsDummy {
			e.d.KV.Free(&r.Request)
			r.State = scheduler.Complete
			removed = true
			continue
		}
		r.pending--
		if r.stopped {
			// A step launched before its stop token was seen or before it
			// was cancelled (overlap loop): its token is dropped, and the
			// request completes once no launched step holds it.
			if r.pending == 0 {
				e.complete(r, now)
				removed = true
			}
			continue
		}
		if !b.sample[i] {
			continue
		}
		tok := res.Sampled[i]
		if tok < 0 {
			return 0, fmt.Errorf("engine did not sample request %d", r.ID)
		}
		wasGeneration := r.Generated > 0
		if r.output == nil {
			// One buffer for the whole output, sized at the first token
			// (not at admission: a waiting request holds none), so that
			// decoding does not regrow it (issue 24, item 3).
			r.output = make([]int32, 0, min(max(r.maxNewTotal, 1), maxOutputPrealloc))
		}
		r.output = append(r.output, tok)
		var lp *TokenLogprobs
		if r.logprobs {
			if len(res.Logprobs) != len(b.reqs) {
				return 0, fmt.Errorf("engine returned %d log-probabilities for a batch of %d (request %d asks for them)",
					len(res.Logprobs), len(b.reqs), r.ID)
			}
			r.outLogprobs = append(r.outLogprobs, stepLogprobs(res, i, r.topLogprobs))
			lp = &r.outLogprobs[len(r.outLogprobs)-1]
		}
		if e.cfg.Stream {
			d := TokenDelta{ID: r.ID, Token: tok, Logprobs: lp}
			if r.promptLP && len(r.output) == 1 {
				// The prompt's log-probabilities ride the first token.
				d.PromptLogprobs = r.promptLogprobs
				if d.PromptLogprobs == nil {
					d.PromptLogprobs = []TokenLogprobs{} // a one-token prompt has none
				}
				r.promptLogprobs = nil // delivered: the response will not carry them
			}
			e.deltas = append(e.deltas, d)
		}
		r.Generated++
		if r.firstTokenNS == 0 {
			r.firstTokenNS = now
		}
		if wasGeneration {
			e.d.KV.UpdateAfterGeneration(&r.Request)
		}
		if r.State != scheduler.GenerationToComplete && (r.stopAtEOS && e.isStopToken(tok) || slices.Contains(r.stopIDs, tok) ||
			r.guide != nil && guideEnds(r.guide, tok)) {
			// Out of the scheduling window from now on; a step already
			// launched with it finishes first (its token is dropped).
			r.stopped = true
			r.State = scheduler.GenerationToComplete
			if r.pending > 0 {
				continue
			}
		}
		if r.State == scheduler.GenerationToComplete {
			e.complete(r, now)
			removed = true
		}
	}
	if removed {
		e.compactActive()
	}
	e.res.ForwardIterations++
	e.res.DeviceMS += res.DeviceMS
	e.res.MoEWaitMS += res.MoEWaitMS
	if b.rec != nil {
		ms := res.DeviceMS
		b.rec.DeviceMS = &ms
		if e.cfg.MoE {
			w := round3(res.MoEWaitMS)
			b.rec.MoEWaitMS = &w
		}
	}
	if e.spare == nil {
		e.spare = b
	}
	// The rank's busy time (lockstep waste) is its compute: the time it
	// waited in MoE exchanges for slower ranks is the waste itself.
	return max(0, res.DeviceMS-res.MoEWaitMS), nil
}

// complete frees a finished request's KV and queues its response.
func (e *Executor) complete(r *request, now int64) {
	r.State = scheduler.Complete
	e.d.KV.Free(&r.Request)
	resp := Response{ID: r.ID, Rank: e.cfg.Rank, Output: r.output, Logprobs: r.outLogprobs,
		ArrivalUnixNS: r.arrivalNS, ScheduledUnixNS: r.scheduledNS, FirstTokenUnixNS: r.firstTokenNS, FinishUnixNS: now,
		Suspended: r.suspended, Recomputed: r.recomputed, ReusedTokens: r.reused, Stopped: r.stopped && !r.cancelled}
	if r.cancelled {
		resp.Error = CancelledError
	}
	if !e.cfg.Stream {
		resp.PromptLogprobs = r.promptLogprobs // (streaming: the first token's delta had them)
	}
	e.finished = append(e.finished, resp)
}

// pickMask is the allowed-token mask of r's next pick (nil: every
// token): its guide's, restricted to its allowed_token_ids, less its stop
// tokens before min_tokens and the tokens that would complete a bad word. A restriction that would leave nothing gives
// way, the guide's mask last (an answer whose guide allows only its end
// is over). The mask is r's own buffer, built in place.
func (e *Executor) pickMask(r *request) []uint32 {
	var guide []uint32
	if r.guide != nil && !r.stopped {
		// Some token is allowed: a guide that allows none has ended the
		// request (applyResults, screenGuide).
		guide = r.guide.Allowed()
	}
	noStops := len(r.output) < r.minTokens && (r.stopAtEOS && len(e.cfg.StopTokens) > 0 || len(r.stopIDs) > 0)
	if len(r.allowIDs) == 0 && !noStops && len(r.badWords) == 0 {
		// (Under min_tokens with no stop token that could end it, as
		// trace replays send with ignore_eos: no mask.)
		return guide
	}
	vocab := e.d.Engine.Shape().VocabSize
	if r.mask == nil {
		r.mask = make([]uint32, bridge.AllowedWords(vocab))
	}
	r.baseMask(guide, vocab)
	if noStops {
		clearID := func(id int32) {
			if id >= 0 && int(id) < vocab {
				r.mask[id/32] &^= 1 << (id % 32)
			}
		}
		if r.stopAtEOS {
			for _, id := range e.cfg.StopTokens {
				clearID(id)
			}
		}
		for _, id := range r.stopIDs {
			clearID(id)
		}
		if !anySet(r.mask) {
			r.baseMask(guide, vocab) // only stop tokens were left
		}
	}
	if len(r.badWords) > 0 {
		r.banBadWords()
		if !anySet(r.mask) {
			r.baseMask(guide, vocab) // only bad words were left
		}
	}
	if !anySet(r.mask) {
		return guide
	}
	return r.mask
}

// banBadWords clears from r.mask the last token of every bad word whose
// other tokens end r's output (vLLM's rule: the output only, not the
// prompt).
func (r *request) banBadWords() {
	for _, w := range r.badWords {
		last := len(w) - 1
		if last > len(r.output) || !slices.Equal(r.output[len(r.output)-last:], w[:last]) {
			continue
		}
		if id := w[last]; int(id)/32 < len(r.mask) {
			r.mask[id/32] &^= 1 << (id % 32)
		}
	}
}

// baseMask puts in r.mask the guide's mask (nil: every token) restricted
// to r's allowed_token_ids, or the guide's alone when they share none.
func (r *request) baseMask(guide []uint32, vocab int) {
	m := r.mask
	if len(r.allowIDs) > 0 && r.allowMask == nil {
		r.allowMask = make([]uint32, len(m))
		for _, id := range r.allowIDs {
			if id >= 0 && int(id) < vocab {
				r.allowMask[id/32] |= 1 << (id % 32)
			}
		}
	}
	switch {
	case guide != nil && r.allowMask != nil:
		for i := range m {
			m[i] = guide[i] & r.allowMask[i]
		}
		if !anySet(m) {
			copy(m, guide)
		}
	case guide != nil:
		copy(m, guide)
	case r.allowMask != nil:
		copy(m, r.allowMask)
	default:
		for i := range m {
			m[i] = ^uint32(0)
		}
		if tail := vocab % 32; tail != 0 {
			m[len(m)-1] = 1<<tail - 1
		}
	}
}

// anySet reports whether a mask allows some token.
func anySet(m []uint32) bool { return slices.ContainsFunc(m, func(w uint32) bool { return w != 0 }) }

// guideEnds advances a request's guide by its new token and reports
// whether generation ends there: the guide took a stop token, its match
// cannot be extended, or (a broken guide) no token is allowed next.
func guideEnds(m *structured.Matcher, tok int32) bool {
	if !m.Advance(tok) || m.Done() {
		return true
	}
	return !m.Live()
}

// isStopToken reports whether tok is one of the model's stop tokens.
func (e *Executor) isStopToken(tok int32) bool {
	for _, s := range e.cfg.StopTokens {
		if s == tok {
			return true
		}
	}
	return false
}

// maxSpareDummies bounds the spent dummies kept for reuse: the overlap
// loop has at most two in flight (one launched, one padded).
const maxSpareDummies = 2

// compactActive drops completed requests and spent dummies, keeping order.
func (e *Executor) compactActive() {
	kept := e.active[:0]
	for _, r := range e.active {
		if r.State == scheduler.Complete {
			e.unindex(r)
			if r.IsDummy && len(e.spareDummies) < maxSpareDummies {
				e.spareDummies = append(e.spareDummies, r) // it ran and left: takeDummy reuses it
			}
			continue
		}
		kept = append(kept, r)
	}
	for i := len(kept); i < len(e.active); i++ {
		e.active[i] = nil
	}
	e.active = kept
}

// scoreTargets is the targets of r's context chunk of n tokens at pos: the
// next prompt token of each row, −1 past the prompt's last (a recomputed
// request's prompt holds its output too, and the last prompt row predicts
// the first output token: sampled, not scored). Valid until the next call.
func (r *request) scoreTargets(pos, n int) []int32 {
	r.scoreBuf = slices.Grow(r.scoreBuf[:0], n)[:n]
	for k := range n {
		r.scoreBuf[k] = -1
		if p := pos + k + 1; p < len(r.prompt) {
			r.scoreBuf[k] = r.prompt[p]
		}
	}
	return r.scoreBuf
}

// applyScores copies b's scored rows into their requests' prompt
// log-probabilities (a recomputed chunk writes the same values again).
func applyScores(b *batch, res *bridge.StepResult) error {
	for _, c := range b.scores {
		r := b.reqs[c.req]
		if c.row+c.n > len(res.ScoreLogprobs) {
			return fmt.Errorf("engine returned %d scored rows for a batch scoring rows up to %d (request %d)",
				len(res.ScoreLogprobs), c.row+c.n, r.ID)
		}
		if r.promptLogprobs == nil {
			r.promptLogprobs = make([]TokenLogprobs, len(r.prompt)-1)
		}
		for k := range c.n {
			p := c.pos + k
			if p+1 >= len(r.prompt) {
				break
			}
			r.promptLogprobs[p] = rowLogprobs(res.ScoreLogprobs, res.ScoreTopIDs, res.ScoreTopLogprobs, c.row+k, r.promptTop)
			r.promptLogprobs[p].Rank = res.ScoreRanks[c.row+k]
		}
	}
	return nil
}

// stepLogprobs copies row i's log-probabilities (its token's and its top
// k) out of an engine result.
func stepLogprobs(res *bridge.StepResult, i, k int) TokenLogprobs {
	return rowLogprobs(res.Logprobs, res.TopLogprobIDs, res.TopLogprobs, i, k)
}

// rowLogprobs copies entry i of a result's log-probability arrays (its
// own, and the first k of its MaxLogprobs top ids and theirs).
func rowLogprobs(lps []float32, ids []int32, tops []float32, i, k int) TokenLogprobs {
	lp := TokenLogprobs{Logprob: lps[i]}
	if k > 0 {
		at := i * bridge.MaxLogprobs
		lp.TopIDs = slices.Clone(ids[at : at+k])
		lp.TopLogprobs = slices.Clone(tops[at : at+k])
	}
	return lp
}

// maxOutputPrealloc bounds the output buffer allocated at a request's first
// token (in tokens); a longer output grows it as append does.
const maxOutputPrealloc = 16384
