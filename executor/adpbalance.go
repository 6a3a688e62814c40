package executor

import (
	"encoding/binary"
	"fmt"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// ADP Balance: TensorRT-LLM's attention_dp_config (enable_balance,
// timeout_iters, batching_wait_iters; its PyTorch executor's
// _balance_adp_requests, tech blog 10 "ADP Balance Strategy").
//
// After every rank scheduled its pass, the ranks' counts of scheduled
// context and generation requests are compared (the padding dummy counts
// as a generation request, as there):
//
//   - context synchronisation: unless every rank has a context request and
//     room for one (fewer than max_batch_size generation requests), every
//     rank holds its contexts back, for at most timeout_iters iterations
//     in a row, and never when some rank has no generation request (the
//     contexts would wait on an idle fleet);
//   - batch equilibration: when every rank has a context and a generation
//     request, the contexts are held batching_wait_iters iterations more
//     (so the ranks gather more contexts each), then run.
//
// Held contexts are not launched: a first chunk's admission is released,
// as for a pass the fleet does not launch (revertGeneration), and a
// continuation keeps its growth. Every rank decides from the same gathered
// counts with the same counters, so the ranks agree.
//
// Deliberate differences from TensorRT-LLM: the counts ride the can_queue
// gather (batch_size, 24 bytes a rank instead of 8 while balance is on)
// rather than a gather of their own; and a held rank's KV admissions are
// released at once, where TensorRT-LLM allocates after the decision.

// ADPBalance is the attention_dp_config of TensorRT-LLM's LLM API.
type ADPBalance struct {
	Enable            bool // enable_balance
	TimeoutIters      int  // timeout_iters (TensorRT-LLM's default 50)
	BatchingWaitIters int  // batching_wait_iters (default 10)
	// CostLeveling is lockstep's own enable_cost_leveling (leveling.go);
	// with Enable too, a pass ADP Balance holds is not leveled. Its first
	// chunks wait at most TimeoutIters iterations in a row.
	CostLeveling bool
}

// DefaultADPBalance is TensorRT-LLM's defaults, balance off.
func DefaultADPBalance() ADPBalance {
	return ADPBalance{TimeoutIters: 50, BatchingWaitIters: 10}
}

// canQueueBalanced is canQueue (C5) with ADP Balance or cost leveling
// (leveling.go): the gather carries each rank's batch size, its scheduled
// context and generation counts and its costs (mandatory work, new first
// chunks, the first of them); out loses the contexts the fleet holds back.
// held: ADP Balance held contexts some rank had; leveled: cost leveling
// deferred a first chunk of some rank.
func (e *Executor) canQueueBalanced(out *scheduler.Output) (canQueue, thisRank, held, leveled bool, err error) {
	mine := e.passCosts(out)
	v := make([]byte, 48)
	for i, x := range []int64{int64(out.NumFitting), int64(len(out.Context)), int64(len(out.Generation)),
		mine.mandatory, mine.first, mine.firstOne} {
		binary.LittleEndian.PutUint64(v[8*i:], uint64(x))
	}
	t := e.waitStart()
	all, err := e.d.Comm.AllGather("batch_size", v)
	e.waitEnd(t)
	if err != nil {
		return false, false, false, false, err
	}
	ok, anyCtx := true, false
	counts := make([][2]int, len(all))
	costs := make([]passCost, len(all))
	for i, x := range all {
		if len(x) != 48 {
			return false, false, false, false, fmt.Errorf("collective desync: batch size from rank %d has %d bytes, want 48 (ADP balance or cost leveling)", i, len(x))
		}
		ok = ok && binary.LittleEndian.Uint64(x) > 0
		counts[i] = [2]int{int(binary.LittleEndian.Uint64(x[8:])), int(binary.LittleEndian.Uint64(x[16:]))}
		costs[i] = passCost{mandatory: int64(binary.LittleEndian.Uint64(x[24:])), first: int64(binary.LittleEndian.Uint64(x[32:])),
			firstOne: int64(binary.LittleEndian.Uint64(x[40:]))}
		anyCtx = anyCtx || counts[i][0] > 0
	}
	if e.cfg.ADPBalance.Enable && e.holdContexts(counts) && anyCtx {
		held = true
		e.res.ADPBalanceHeld++
		if len(out.Context) > 0 {
			e.dropContexts(out)
		}
	} else if e.cfg.ADPBalance.CostLeveling {
		leveled = e.level(out, costs)
	}
	return ok, out.NumFitting > 0, held, leveled, nil
}

// holdContexts is the balance decision on every rank's [contexts,
// generations] counts; it advances the counters.
func (e *Executor) holdContexts(counts [][2]int) bool {
	allCtx, allGen, allFree := true, true, true
	for _, c := range counts {
		allCtx = allCtx && c[0] > 0
		allGen = allGen && c[1] > 0
		allFree = allFree && c[1] < e.cfg.Scheduler.MaxBatchSize
	}
	cfg := e.cfg.ADPBalance
	if allFree && allCtx {
		e.adpWait = 0
		if !allGen {
			return false
		}
		if e.adpBatch < cfg.BatchingWaitIters {
			e.adpBatch++
			return true
		}
		e.adpBatch = 0
		return false
	}
	e.adpWait++
	if e.adpWait >= cfg.TimeoutIters || !allGen {
		e.adpWait = 0
		return false
	}
	return true
}

// dropContexts takes this pass's contexts out of out: first chunks give
// their admission back (revertGeneration's rule), continuations keep their
// growth and are scheduled again.
func (e *Executor) dropContexts(out *scheduler.Output) {
	for _, r := range out.Context {
		if r.State == scheduler.ContextInit && !r.IsDummy {
			e.d.KV.ReleaseContextAdmission(r)
		}
	}
	out.Context, out.Charged = out.Context[:0], out.Charged[:0]
	out.NumFitting = len(out.Generation)
	out.CostUsed = 0
}
