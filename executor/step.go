package executor

import (
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// prepareBatch assigns batch slots and asserts that every scheduled request's
// cache is active (the scheduler already allocated, in both policies).
func (e *Executor) prepareBatch(out *scheduler.Output) error {
	e.batch = e.batch[:0]
	for _, list := range [][]*scheduler.Request{out.Context, out.Generation} {
		for _, s := range list {
			r := e.byID[s.ID]
			if r == nil {
				return fmt.Errorf("invariant prepareBatch: scheduled request %d is not active", s.ID)
			}
			if !e.d.KV.IsActive(r.ID) {
				return fmt.Errorf("invariant prepareBatch: scheduled request %d has no active KV cache", r.ID)
			}
			r.BatchIndex = len(e.batch)
			e.batch = append(e.batch, r)
		}
	}
	return nil
}

// forward builds the step descriptor (one cgo call for the whole batch), runs
// it and applies the sampled tokens.
func (e *Executor) forward(start time.Time) (float64, error) {
	seqs := e.step.Seqs[:0]
	for _, r := range e.batch {
		var s bridge.SeqStep
		if r.State.IsContext() {
			pos := r.ContextPosition
			s = bridge.SeqStep{Tokens: r.Tokens[pos : pos+r.ChunkSize], StartPos: pos,
				Sample: pos+r.ChunkSize == r.PromptLen}
		} else {
			s = bridge.SeqStep{Tokens: e.tokenBuf(r), StartPos: r.PromptLen + r.Generated - 1, Sample: !r.IsDummy}
		}
		s.BlockTable = e.d.KV.BlockTable(r.ID)
		seqs = append(seqs, s)
	}
	e.step.Seqs = seqs
	if err := e.d.Engine.Step(&e.step, &e.stepRes); err != nil {
		return 0, err
	}
	if len(e.stepRes.Sampled) != len(e.batch) {
		return 0, fmt.Errorf("engine returned %d sampled tokens for a batch of %d", len(e.stepRes.Sampled), len(e.batch))
	}
	now := e.cfg.Clock().UnixNano()
	for i, r := range e.batch {
		if err := e.apply(r, e.stepRes.Sampled[i], now); err != nil {
			return 0, err
		}
	}
	// Dummies and finished requests leave active after the forward.
	kept := e.active[:0]
	for _, r := range e.active {
		if r.IsDummy || r.State == scheduler.Complete {
			delete(e.byID, r.ID)
			continue
		}
		kept = append(kept, r)
	}
	for i := len(kept); i < len(e.active); i++ {
		e.active[i] = nil
	}
	e.active = kept
	return e.stepRes.DeviceMS, nil
}

// tokenBuf returns a one-token slice holding r's next generation input.
func (e *Executor) tokenBuf(r *request) []int32 {
	if r.IsDummy {
		return r.Tokens[:1]
	}
	return r.output[len(r.output)-1:]
}

// apply advances one request after the step (non-overlap: results are known
// right away, so a finishing request goes straight to COMPLETE).
func (e *Executor) apply(r *request, tok int32, now int64) error {
	r.BatchIndex = scheduler.NoBatchIndex
	if r.IsDummy {
		e.d.KV.Free(&r.Request)
		return nil
	}
	if r.State.IsContext() {
		r.ContextPosition += r.ChunkSize
		e.d.KV.UpdateAfterContext(&r.Request)
		if r.ContextPosition < r.PromptLen {
			r.State = scheduler.ContextInProgress
			return nil
		}
		if tok < 0 {
			return fmt.Errorf("engine did not sample the last chunk of request %d", r.ID)
		}
		r.State = scheduler.GenerationInProgress
	} else {
		e.d.KV.UpdateAfterGeneration(&r.Request)
	}
	if tok < 0 {
		return fmt.Errorf("engine did not sample generation request %d", r.ID)
	}
	r.output = append(r.output, tok)
	r.Generated++
	if r.firstTokenNS == 0 {
		r.firstTokenNS = now
	}
	if r.Generated >= r.MaxNewTokens {
		r.State = scheduler.Complete
		e.d.KV.Free(&r.Request)
		e.finished = append(e.finished, Response{ID: r.ID, Rank: e.cfg.Rank, Output: r.output,
			ArrivalUnixNS: r.arrivalNS, FirstTokenUnixNS: r.firstTokenNS, FinishUnixNS: now,
			Suspended: r.suspended, Recomputed: r.recomputed})
	}
	return nil
}
