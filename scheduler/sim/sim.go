// Package sim is a minimal, deterministic single-rank executor for the
// scheduler: it admits requests at their arrival iteration, runs one
// scheduling pass per iteration, and applies the plan the way the real
// executor does in the non-overlap loop (a scheduled chunk advances the
// context position, a generation step adds one token, a finished request
// frees its pages, a recompute-paused request is reset to re-prefill).
//
// It drives the scheduler's scenario tests and the `worker schedule` dry-run
// tool. Like the scheduler it is pure: no I/O, no clock, no randomness.
package sim

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Pool is the KV side of the simulation: the scheduler's KVManager plus the
// executor-side calls the simulation needs.
type Pool interface {
	scheduler.KVManager
	// Materialize gives r an active cache holding the KV it already has:
	// ContextPosition prompt tokens, plus Generated−1 generated tokens for a
	// generation request.
	Materialize(r *scheduler.Request) error
	// AfterContext is called once r's scheduled chunk of r.ChunkSize tokens
	// has executed and r.ContextPosition has advanced past it.
	AfterContext(r *scheduler.Request) error
	// AfterGeneration is called once r's generation step has executed and its
	// token was appended (r.Generated already counts it).
	AfterGeneration(r *scheduler.Request) error
}

// Spec describes one request of a scenario.
type Spec struct {
	ID               uint64
	Arrive           int // iteration at which it joins the active list
	PromptLen        int
	Position         int // prompt tokens already in KV
	MaxNewTokens     int
	Generated        int   // tokens already generated
	UncachedEstimate int64 // scheduler.UnsetEstimate if none
	ConversationID   string
	InFlight         bool // part of the batch executing at the first iteration
}

// Chunk is one scheduled context chunk of a Record.
type Chunk struct {
	ID       uint64 `json:"id"`
	Chunk    int    `json:"chunk"`
	Position int    `json:"position"` // context position before the chunk
}

// Record is what one iteration scheduled.
type Record struct {
	Iteration       int      `json:"iteration"`
	Context         []Chunk  `json:"context"`
	Generation      []uint64 `json:"generation"`
	Suspended       []uint64 `json:"suspended"`
	RecomputePaused []uint64 `json:"recompute_paused"`
	Demoted         []uint64 `json:"demoted"`
	CostUsed        int64    `json:"cost_used"`
	// The fields below are not part of the dry-run format.
	SatOut   []uint64 `json:"-"`
	Deferred []uint64 `json:"-"`
	Finished []uint64 `json:"-"`
}

// Sim runs one rank's iterations.
type Sim struct {
	S      *scheduler.Scheduler
	Pool   Pool
	Active []*scheduler.Request // FCFS order

	waiting []Spec // not arrived yet, in FCFS order
	iter    int
	prompts map[uint64][]int32 // current prompt plus generated tokens
	exec    []uint64
}

// New returns a simulation over s and pool with the given requests. Requests
// are admitted in FCFS order: by Arrive, then by their order in specs.
// Errors name the request id and field.
func New(s *scheduler.Scheduler, pool Pool, specs []Spec) (*Sim, error) {
	if err := Validate(specs); err != nil {
		return nil, err
	}
	sm := &Sim{S: s, Pool: pool, prompts: map[uint64][]int32{}}
	for _, sp := range specs {
		sm.enqueue(sp)
	}
	return sm, nil
}

// Validate checks specs as New does: unique ids and consistent fields.
// Errors name the request id and field.
func Validate(specs []Spec) error {
	seen := map[uint64]bool{}
	for _, sp := range specs {
		if seen[sp.ID] {
			return fmt.Errorf("request %d: id: duplicate", sp.ID)
		}
		seen[sp.ID] = true
		if err := sp.validate(); err != nil {
			return err
		}
	}
	return nil
}

// Unfinished returns the ids of the requests that have not finished: the
// active ones in FCFS order, then those not arrived yet.
func (sm *Sim) Unfinished() []uint64 {
	ids := make([]uint64, 0, len(sm.Active)+len(sm.waiting))
	for _, r := range sm.Active {
		ids = append(ids, r.ID)
	}
	for _, sp := range sm.waiting {
		ids = append(ids, sp.ID)
	}
	return ids
}

// Add queues one more request. An Arrive earlier than the next iteration
// means "at the next iteration".
func (sm *Sim) Add(sp Spec) error {
	if err := sp.validate(); err != nil {
		return err
	}
	if _, dup := sm.prompts[sp.ID]; dup {
		return fmt.Errorf("request %d: id: duplicate", sp.ID)
	}
	for _, w := range sm.waiting {
		if w.ID == sp.ID {
			return fmt.Errorf("request %d: id: duplicate", sp.ID)
		}
	}
	sp.Arrive = max(sp.Arrive, sm.iter)
	sm.enqueue(sp)
	return nil
}

// enqueue inserts sp after every waiting request arriving no later (stable:
// file order within an iteration).
func (sm *Sim) enqueue(sp Spec) {
	at := len(sm.waiting)
	for at > 0 && sm.waiting[at-1].Arrive > sp.Arrive {
		at--
	}
	sm.waiting = append(sm.waiting, Spec{})
	copy(sm.waiting[at+1:], sm.waiting[at:])
	sm.waiting[at] = sp
}

func (sp Spec) validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("request %d: %s: %s", sp.ID, field, fmt.Sprintf(format, args...))
	}
	switch {
	case sp.Arrive < 0:
		return bad("arrive", "%d is negative", sp.Arrive)
	case sp.PromptLen < 1:
		return bad("prompt_len", "%d, want ≥ 1", sp.PromptLen)
	case sp.Position < 0 || sp.Position > sp.PromptLen:
		return bad("position", "%d, want 0 … prompt_len (%d)", sp.Position, sp.PromptLen)
	case sp.MaxNewTokens < 1:
		return bad("max_new_tokens", "%d, want ≥ 1", sp.MaxNewTokens)
	case sp.Generated < 0 || sp.Generated >= sp.MaxNewTokens:
		return bad("generated", "%d, want 0 … max_new_tokens−1 (%d)", sp.Generated, sp.MaxNewTokens-1)
	case sp.Generated > 0 && sp.Position != sp.PromptLen:
		return bad("generated", "%d tokens generated but position %d < prompt_len %d", sp.Generated, sp.Position, sp.PromptLen)
	case sp.Position == sp.PromptLen && sp.Generated == 0:
		return bad("position", "the whole prompt is in KV but generated is 0 (the last chunk samples a token)")
	case sp.UncachedEstimate < scheduler.UnsetEstimate:
		return bad("uncached_estimate", "%d is negative", sp.UncachedEstimate)
	}
	return nil
}

// Iteration is the number of the next iteration.
func (sm *Sim) Iteration() int { return sm.iter }

// Done reports whether every request has arrived and finished.
func (sm *Sim) Done() bool { return len(sm.waiting) == 0 && len(sm.Active) == 0 }

// Step admits arrivals, runs one scheduling pass and applies it.
func (sm *Sim) Step() (Record, *scheduler.Output, error) {
	rec := Record{Iteration: sm.iter}
	if err := sm.admit(); err != nil {
		return rec, nil, err
	}
	out, err := sm.S.Schedule(sm.Active, sm.exec)
	sm.exec = sm.exec[:0]
	if err != nil {
		return rec, nil, fmt.Errorf("iteration %d: %w", sm.iter, err)
	}
	rec.CostUsed = out.CostUsed
	rec.Demoted = append([]uint64{}, out.Demoted...)
	rec.Deferred = append([]uint64{}, out.Deferred...)
	rec.Context = []Chunk{}
	for _, r := range out.Context {
		rec.Context = append(rec.Context, Chunk{ID: r.ID, Chunk: r.ChunkSize, Position: r.ContextPosition})
	}
	rec.Generation = idsOf(out.Generation)
	rec.Suspended = idsOf(out.Paused)
	rec.RecomputePaused = idsOf(out.RecomputePaused)
	rec.SatOut = idsOf(out.SatOut)
	if err := sm.apply(out, &rec); err != nil {
		return rec, out, fmt.Errorf("iteration %d: %w", sm.iter, err)
	}
	sm.iter++
	return rec, out, nil
}

func idsOf(rs []*scheduler.Request) []uint64 {
	out := make([]uint64, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// admit moves the requests arriving at this iteration to the active list.
func (sm *Sim) admit() error {
	n := 0
	for n < len(sm.waiting) && sm.waiting[n].Arrive <= sm.iter {
		n++
	}
	for _, sp := range sm.waiting[:n] {
		r := &scheduler.Request{
			ID: sp.ID, PromptLen: sp.PromptLen, ContextPosition: sp.Position,
			MaxNewTokens: sp.MaxNewTokens, Generated: sp.Generated,
			UncachedEstimate: sp.UncachedEstimate, ConversationID: sp.ConversationID,
			BatchIndex: scheduler.NoBatchIndex,
		}
		toks := make([]int32, sp.PromptLen, sp.PromptLen+sp.MaxNewTokens)
		for i := range toks {
			toks[i] = promptToken(sp.ID, i)
		}
		for i := 0; i < sp.Generated; i++ {
			toks = append(toks, generatedToken(sp.ID, i))
		}
		sm.prompts[sp.ID] = toks
		r.Tokens = toks[:sp.PromptLen:sp.PromptLen]
		switch {
		case sp.Generated > 0:
			r.State = scheduler.GenerationInProgress
		case sp.Position > 0:
			r.State = scheduler.ContextInProgress
		default:
			r.State = scheduler.ContextInit
		}
		if r.State != scheduler.ContextInit {
			if err := sm.Pool.Materialize(r); err != nil {
				return fmt.Errorf("request %d: position: cannot materialise its KV: %w", sp.ID, err)
			}
		}
		if sp.InFlight {
			sm.exec = append(sm.exec, sp.ID)
		}
		sm.Active = append(sm.Active, r)
	}
	sm.waiting = sm.waiting[n:]
	return nil
}

// promptToken and generatedToken synthesise deterministic token ids.
func promptToken(id uint64, i int) int32    { return int32((id*7919 + uint64(i)*104729) % 32000) }
func generatedToken(id uint64, i int) int32 { return int32((id*31 + uint64(i)*17 + 1) % 32000) }

// apply executes the plan: recompute resets, context chunks, generation
// steps, then removal of finished requests (non-overlap loop).
func (sm *Sim) apply(out *scheduler.Output, rec *Record) error {
	for _, r := range out.RecomputePaused {
		sm.resetForRecompute(r)
	}
	for _, r := range out.Context {
		r.ContextPosition += r.ChunkSize
		if err := sm.Pool.AfterContext(r); err != nil {
			return fmt.Errorf("request %d: after context: %w", r.ID, err)
		}
		if r.ContextPosition < r.PromptLen {
			r.State = scheduler.ContextInProgress
			continue
		}
		// The last chunk samples the first token.
		r.State = scheduler.GenerationInProgress
		sm.sample(r)
	}
	for _, r := range out.Generation {
		sm.sample(r)
		if err := sm.Pool.AfterGeneration(r); err != nil {
			return fmt.Errorf("request %d: after generation: %w", r.ID, err)
		}
	}
	kept := sm.Active[:0]
	for _, r := range sm.Active {
		if r.State == scheduler.Complete {
			sm.Pool.Free(r)
			rec.Finished = append(rec.Finished, r.ID)
			delete(sm.prompts, r.ID)
			continue
		}
		kept = append(kept, r)
	}
	clear(sm.Active[len(kept):])
	sm.Active = kept
	return nil
}

// sample appends one generated token; the request completes at its limit.
func (sm *Sim) sample(r *scheduler.Request) {
	sm.prompts[r.ID] = append(sm.prompts[r.ID], generatedToken(r.ID, r.Generated))
	r.Generated++
	if r.Generated >= r.MaxNewTokens {
		r.State = scheduler.Complete
	}
}

// resetForRecompute is executor.md §11.2: the generated tokens join the
// prompt, the request re-prefills from position 0 and keeps its FCFS place.
func (sm *Sim) resetForRecompute(r *scheduler.Request) {
	n := r.Generated
	if r.State == scheduler.GenerationInProgress || r.State == scheduler.GenerationToComplete {
		r.PromptLen += n
		r.MaxNewTokens -= n
		r.Generated = 0
	}
	toks := sm.prompts[r.ID]
	r.Tokens = toks[:r.PromptLen:r.PromptLen]
	r.State = scheduler.ContextInit
	r.ContextPosition = 0
	r.ChunkSize = r.PromptLen
	r.BatchIndex = scheduler.NoBatchIndex
	r.Recomputed = true
}
