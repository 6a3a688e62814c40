package fake

import (
	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/internal/goengine"
)

// Cost model of the fake engine: DeviceMS = stepMS + tokenMS·Σ new tokens +
// contextMS·Σ attended positions (start_pos + new tokens, per sequence).
// The values are arbitrary but fixed, so schedules that differ in batch
// shape get different, reproducible times.
const (
	stepMS    = 0.05
	tokenMS   = 0.001
	contextMS = 0.00001
)

// FNV-1a 64-bit parameters.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

// Step validates the whole batch (nothing is written when any sequence is
// invalid), writes every sequence's new tokens into its pages at their
// positions, then samples: a sampled sequence gets
// FNV-1a(seed, tokens read back from its pages at positions [0, last]) mod
// vocab when greedy; with sampling parameters (SeqStep.Sampling) it is
// bridge.Sample of the pseudo-logits row (appendLogits) at the sampled
// position. res's slices are reused when large enough.
func (e *Engine) Step(desc *bridge.StepDesc, res *bridge.StepResult) error {
	if err := e.usable("step"); err != nil {
		return err
	}
	if desc == nil || res == nil {
		return invalid("step", "desc and res must not be nil")
	}
	if err := e.inflight.RequireIdle("step"); err != nil {
		return err
	}
	return e.run("step", desc, res)
}

// Submit runs the step at once and keeps its result for Wait (at most
// bridge.MaxInflight outstanding).
func (e *Engine) Submit(desc *bridge.StepDesc) error {
	if err := e.usable("submit"); err != nil {
		return err
	}
	if desc == nil {
		return invalid("submit", "desc must not be nil")
	}
	slot, err := e.inflight.Next("submit")
	if err != nil {
		return err
	}
	if err := e.run("submit", desc, slot); err != nil {
		return err
	}
	e.inflight.Push()
	return nil
}

// Wait returns the oldest submitted step's result.
func (e *Engine) Wait(res *bridge.StepResult) error {
	if err := e.usable("wait"); err != nil {
		return err
	}
	if res == nil {
		return invalid("wait", "res must not be nil")
	}
	r, err := e.inflight.Pop("wait")
	if err != nil {
		return err
	}
	goengine.CopyResult(res, r)
	return nil
}

// run validates (bridge.StepChecker: nothing is written when any sequence
// is invalid) and executes one step; op names the call in errors.
func (e *Engine) run(op string, desc *bridge.StepDesc, res *bridge.StepResult) error {
	if err := e.check.Check(op, desc); err != nil {
		return err
	}
	tokens, context := 0, 0
	for i := range desc.Seqs {
		sq := &desc.Seqs[i]
		e.write(sq)
		tokens += len(sq.Tokens)
		context += sq.StartPos + len(sq.Tokens)
	}
	// A sequence's token is its content hash modulo the vocabulary; other
	// sampling draws from the pseudo-logits row whose argmax it is.
	e.row = goengine.Sample(desc, res, e.shape.VocabSize, e.contentHash, appendLogits, e.row)
	e.hashes, e.row = goengine.Score(desc, res, e.shape.VocabSize, e.rowHashes, appendLogits, e.hashes, e.row)
	res.DeviceMS = stepMS + tokenMS*float64(tokens) + contextMS*float64(context)
	res.MoEWaitMS = 0 // no expert parallelism; res is overwritten whole
	return nil
}

// slot is the slab index of position pos through a block table.
func (e *Engine) slot(bt []int32, pos int) int {
	P := e.cfg.TokensPerPage
	return int(bt[pos/P])*P + pos%P
}

// write stores the new tokens at their positions.
func (e *Engine) write(sq *bridge.SeqStep) {
	for k, t := range sq.Tokens {
		e.device[e.slot(sq.BlockTable, sq.StartPos+k)] = t
	}
}

// contentHash hashes the seed and the tokens read back from the pages at
// positions [0, last new position]: the fake's stand-in for attention over
// the whole prefix.
func (e *Engine) contentHash(sq *bridge.SeqStep) uint64 {
	h := e.seedHash()
	last := sq.StartPos + len(sq.Tokens) - 1
	for pos := 0; pos <= last; pos++ {
		h = fnvWord(h, uint32(e.device[e.slot(sq.BlockTable, pos)]))
	}
	return h
}

// rowHashes appends contentHash of sq cut after each of its tokens (one
// pass over the positions).
func (e *Engine) rowHashes(sq *bridge.SeqStep, dst []uint64) []uint64 {
	h := e.seedHash()
	last := sq.StartPos + len(sq.Tokens) - 1
	for pos := 0; pos <= last; pos++ {
		h = fnvWord(h, uint32(e.device[e.slot(sq.BlockTable, pos)]))
		if pos >= sq.StartPos {
			dst = append(dst, h)
		}
	}
	return dst
}

// seedHash is FNV-1a's state after the seed: where a content hash starts.
func (e *Engine) seedHash() uint64 {
	return fnvWord(fnvWord(fnvOffset, uint32(e.cfg.Seed)), uint32(e.cfg.Seed>>32))
}

// fnvWord feeds a 32-bit word, little-endian, into FNV-1a.
func fnvWord(h uint64, w uint32) uint64 {
	for range 4 {
		h ^= uint64(w & 0xff)
		h *= fnvPrime
		w >>= 8
	}
	return h
}

// appendLogits appends one deterministic row: pseudo-random values in
// [0, 1) derived from the content hash, and 2 at the sampled token, so that
// argmax(row) is the sampled token.
//
// The twin's row (bridge/twin appendLogits) mixes h+v instead of
// h^v·golden: both are valid rows with the sampled token as argmax, and
// neither is a bug, but stochastic sampling draws from the row, so merging
// the two would change every sampled token (and digest) of one engine's
// past runs. Each engine keeps its own.
func appendLogits(dst []float32, h uint64, tok int32, vocab int) []float32 {
	for v := range vocab {
		x := goengine.Mix64(h ^ uint64(v)*0x9e3779b97f4a7c15)
		dst = append(dst, float32(x>>40)/float32(1<<24))
	}
	dst[len(dst)-vocab+int(tok)] = 2
	return dst
}
