package executor

import (
	"github.com/lockstep-ai/lockstep/scheduler"
)

// Cost leveling (attention_dp_config.enable_cost_leveling; lockstep's own,
// issue 25): under attention DP every forward lasts as long as its most
// expensive rank, so a rank that adds a new prompt's first chunk while the
// others only decode makes all of them wait. After every rank planned its
// pass, the ranks exchange (on the batch_size gather of the forward
// agreement) the predicted cost of their work, with the equal-cost model:
// a chunk of n tokens starting at position p costs n·(O + p + n/2), a
// decode step at KV depth kv costs O + kv, O the equal-cost KV offset
// (scheduler.equal_cost.kv_cost_offset, or the online calibrator's last
// publication).
//
//   - mandatory work M_r: rank r's decodes and continuation chunks (started
//     prompts), which run whatever happens;
//   - the target T = max_r M_r: the heaviest mandatory work, which the
//     forward costs anyway;
//   - rank r keeps its new first chunks, in the scheduler's order, while
//     M_r + Σ kept ≤ T; with chunked prefill the first one that does not
//     fit is cut to the most whole chunk units whose cost still fits (the
//     room T − M_r − Σ kept; the rest of its prompt is a continuation next
//     pass); the others wait for the next pass (their admission is given
//     back, as for a pass the fleet does not launch).
//
// Contexts are never held back when every rank has one, nor when no rank
// could keep any of its first one (T would forbid all context work: the
// fleet would only stall), nor after TimeoutIters passes in a row that
// deferred or cut some rank's first chunk. Every rank computes T and the
// escapes from the same gathered costs; each keeps, cuts or defers only its
// own chunks.

// passCost is one rank's predicted costs of a pass (equal-cost units).
type passCost struct {
	mandatory int64 // decodes and continuation chunks
	first     int64 // new first chunks
	// firstOne is the least of the first new first chunk this rank could
	// keep (0: none): one chunk unit of it with chunked prefill (when it is
	// longer), else all of it.
	firstOne int64
}

// costOffset is O: the online calibrator's last publication, else the
// configured equal-cost offset (0 when equal-cost chunking is off: then
// costs are attention only).
func (e *Executor) costOffset() int64 {
	if n := len(e.res.CostPublications); n > 0 {
		return e.res.CostPublications[n-1].Offset
	}
	return max(0, e.cfg.Scheduler.EqualCost.KVOffset)
}

// chunkCost is n·(O + p + n/2).
func chunkCost(o int64, pos, n int) int64 {
	return int64(n) * (o + int64(pos) + int64(n)/2)
}

// passCosts is this rank's passCost of out.
func (e *Executor) passCosts(out *scheduler.Output) passCost {
	o := e.costOffset()
	var c passCost
	for _, r := range out.Generation {
		if !r.IsDummy {
			c.mandatory += o + int64(r.PromptLen+r.Generated)
		}
	}
	for _, r := range out.Context {
		k := chunkCost(o, r.ContextPosition, r.ChunkSize)
		if r.State != scheduler.ContextInit {
			c.mandatory += k
			continue
		}
		if c.firstOne == 0 {
			c.firstOne = k
			if u := e.levelUnit(); u > 0 && r.ChunkSize > u {
				c.firstOne = chunkCost(o, r.ContextPosition, u)
			}
		}
		c.first += k
	}
	return c
}

// levelTarget is the rule on every rank's costs: the target T, and whether
// some rank must defer a first chunk (false: every rank keeps its own,
// because no rank has a first chunk, every rank has one, none could keep
// its first, or all of them fit under T).
func levelTarget(costs []passCost) (int64, bool) {
	var target int64
	for _, c := range costs {
		target = max(target, c.mandatory)
	}
	allFirst, anyFirst, anyFits, deferred := true, false, false, false
	for _, c := range costs {
		allFirst = allFirst && c.first > 0
		if c.first > 0 {
			anyFirst = true
			anyFits = anyFits || c.mandatory+c.firstOne <= target
			deferred = deferred || c.mandatory+c.first > target
		}
	}
	return target, anyFirst && !allFirst && anyFits && deferred
}

// level applies the rule to this rank's out; it reports whether some rank
// deferred a first chunk (and advances the timeout counter alike on every
// rank).
func (e *Executor) level(out *scheduler.Output, costs []passCost) bool {
	target, ok := levelTarget(costs)
	if !ok || e.levelWait+1 >= max(1, e.cfg.ADPBalance.TimeoutIters) {
		e.levelWait = 0
		return false
	}
	e.levelWait++
	e.res.CostLeveled++
	mine := costs[e.cfg.Rank]
	if mine.mandatory+mine.first <= target {
		return true // this rank keeps all of its first chunks
	}
	o := e.costOffset()
	budget := target - mine.mandatory
	keep := out.Context[:0]
	charged := out.Charged[:0]
	kept := true
	for i, r := range out.Context {
		c := 0
		if i < len(out.Charged) {
			c = out.Charged[i]
		}
		if r.State == scheduler.ContextInit {
			k := chunkCost(o, r.ContextPosition, r.ChunkSize)
			if kept && k > budget {
				kept = false // this one is cut or deferred, every later one deferred
				if n := cutChunk(o, r.ContextPosition, r.ChunkSize, e.levelUnit(), budget); n > 0 {
					r.ChunkSize, c = n, n
					k = chunkCost(o, r.ContextPosition, n)
					e.res.CostLevelCut++
				} else {
					e.d.KV.ReleaseContextAdmission(r)
					continue
				}
			} else if !kept {
				e.d.KV.ReleaseContextAdmission(r)
				continue
			}
			budget -= k
		}
		keep = append(keep, r)
		if i < len(out.Charged) {
			charged = append(charged, c)
		}
	}
	clear(out.Context[len(keep):])
	out.Context, out.Charged = keep, charged
	out.NumFitting = len(out.Context) + len(out.Generation)
	return true
}

// levelUnit is the chunk unit a first chunk may be cut to (0: chunks are
// not cut, chunked prefill is off). The scheduler's own unit, so that a cut
// chunk is one it could have planned: a multiple of the unit that is not
// the prompt's last.
func (e *Executor) levelUnit() int {
	if !e.cfg.Scheduler.ChunkedContext {
		return 0
	}
	if p, ok := e.d.Planner.(interface{ ChunkUnitSize() int }); ok {
		return p.ChunkUnitSize()
	}
	if u := e.cfg.Scheduler.ChunkUnitSize; u > 0 {
		return u
	}
	return e.d.KV.LedgerBlockTokens()
}

// cutChunk is the most whole units u of a chunk of n tokens at position pos
// whose cost n'·(O + pos + n'/2) is at most room (0: not even one unit, or
// no unit). The cut is shorter than n: a chunk that fits is not cut.
func cutChunk(o int64, pos, n, u int, room int64) int {
	if u <= 0 || n <= u || room <= 0 {
		return 0
	}
	lo, hi := 0, (n-1)/u // whole units strictly below n
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if chunkCost(o, pos, mid*u) <= room {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo * u
}
