package executor

// E-suite (executor.md §14), on the test rig of rig_test.go.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// ---------------------------------------------------------------------------
// E-01 … E-06: padding (§4.2)
// ---------------------------------------------------------------------------

func TestESuitePadding(t *testing.T) {
	comms := func() nccl.Comm { return nccl.NewLocalGroup(2, nccl.LocalOptions{})[0] }

	t.Run("E-01 no schedulable request, capacity available: one pending dummy", func(t *testing.T) {
		e, kv, pool := unitExec(t, 0, 2, 16, comms())
		e.padDummy()
		require.Len(t, e.active, 1)
		d := e.active[0]
		require.True(t, d.IsDummy)
		require.Equal(t, dummyIDBase, d.ID, "the first dummy takes 2^63")
		require.Same(t, d, e.dummy, "the dummy is pending")
		require.Equal(t, scheduler.GenerationInProgress, d.State)
		require.Equal(t, 1, d.PromptLen)
		require.True(t, pool.IsActive(d.ID))
		require.Equal(t, 1, kv.addDummies)
		require.Equal(t, 15, pool.FreePages())
	})

	t.Run("E-02 one schedulable request: no dummy", func(t *testing.T) {
		for _, st := range []scheduler.State{scheduler.ContextInit, scheduler.ContextInProgress, scheduler.GenerationInProgress} {
			e, kv, _ := unitExec(t, 0, 2, 16, comms())
			r := inject(e, newRequest(arrival(1, 4, 2)))
			r.State = st
			e.padDummy()
			require.Equal(t, []uint64{1}, activeIDs(e), "state %v", st)
			require.Nil(t, e.dummy)
			require.Zero(t, kv.addDummies, "no AddDummy call with a schedulable request (state %v)", st)
		}
	})

	t.Run("E-03 only GENERATION_TO_COMPLETE requests: dummy added", func(t *testing.T) {
		e, _, _ := unitExec(t, 0, 2, 16, comms())
		r := inject(e, newRequest(arrival(1, 4, 2)))
		r.State = scheduler.GenerationToComplete
		e.padDummy()
		require.Equal(t, []uint64{1, dummyIDBase}, activeIDs(e))
		require.Same(t, e.active[1], e.dummy)
	})

	t.Run("E-04 AvailableTokens 0: no dummy, nothing pending", func(t *testing.T) {
		e, kv, pool := unitExec(t, 0, 2, 2, comms())
		require.True(t, pool.AddDummy(&scheduler.Request{ID: 77}, 16)) // occupy both pages
		require.Zero(t, pool.AvailableTokens())
		e.padDummy()
		require.Empty(t, e.active)
		require.Nil(t, e.dummy)
		require.Zero(t, kv.addDummies, "the capacity pre-check runs before AddDummy")
	})

	t.Run("E-05 AddDummy fails: no dummy, id not consumed", func(t *testing.T) {
		e, kv, _ := unitExec(t, 0, 2, 16, comms())
		kv.failAddDummy = 1
		e.padDummy()
		require.Empty(t, e.active)
		require.Nil(t, e.dummy)
		require.Equal(t, 1, kv.addDummies)
		e.padDummy()
		require.Equal(t, []uint64{dummyIDBase}, activeIDs(e), "a failed AddDummy does not consume a dummy id")
	})
}

// E-06: attention-DP off, never a dummy.
func TestE06NoDummyWithoutAttentionDP(t *testing.T) {
	// One rank (no attention DP) and a Helix CP group of two: the loop
	// never pads, even while the rank waits for work.
	for _, helix := range []bool{false, true} {
		n := 1
		if helix {
			n = 2
		}
		src := &scriptSource{byIter: [][]Arrival{nil, nil, {arrival(1, 12, 3)}, nil, {arrival(2, 5, 4)}}}
		g := (&rig{n: n, helix: helix, src: src}).build(t)
		g.drive(0)
		g.requireNoErrors(t)
		for _, rr := range g.ranks {
			require.Zero(t, rr.kv.addDummies, "helix %v rank %d", helix, rr.rank)
			for _, p := range rr.plan.passes {
				for _, id := range append(slices.Clone(p.ctx), p.gen...) {
					require.Less(t, id, dummyIDBase, "helix %v rank %d scheduled a dummy", helix, rr.rank)
				}
			}
			for _, line := range rr.log.lines {
				var rec IterRecord
				require.NoError(t, json.Unmarshal(line, &rec))
				require.False(t, rec.ADPDummy)
			}
		}
		require.Len(t, g.outputs(t), 2)
	}
}

// ---------------------------------------------------------------------------
// E-07 … E-09: finalising and rolling back the dummy (§4.4)
// ---------------------------------------------------------------------------

// E-07: rank 0 pads dummy #1 while rank 1's batch is empty (its AddDummy
// fails): sizes [1, 0], can_queue false, dummy #1 rolled back and freed. In
// the next iteration rank 0 pads dummy #2, a new object; sizes [1, 1]: it is
// committed and stays in active behind rank 0's other requests (overlap
// loop: it is still in flight at the end of the iteration).
func TestE07DummyRolledBackThenCommitted(t *testing.T) {
	g := (&rig{n: 2, overlap: true, src: &scriptSource{byIter: make([][]Arrival, 100)}}).build(t)
	r0, r1 := g.ranks[0], g.ranks[1]
	// Rank 0 holds a retiring request (outside the scheduler window): it
	// keeps the fleet busy without being schedulable.
	other := inject(r0.ex, newRequest(arrival(5, 4, 2)))
	other.State = scheduler.GenerationToComplete
	r1.kv.failAddDummy = 1 // rank 1 cannot pad in the first iteration

	// Capture dummy #1 right after scheduling (it is pending then) and the
	// gathered batch sizes of every iteration.
	var first *request
	r0.plan.after = func(*scheduler.Output) {
		if len(r0.plan.passes) == 1 {
			first = r0.ex.dummy
		}
	}
	var sizes [][]uint64
	r0.hc.recv = func(name string, all [][]byte) {
		if name == "batch_size" {
			var v []uint64
			for _, b := range all {
				v = append(v, binary.LittleEndian.Uint64(b))
			}
			sizes = append(sizes, v)
		}
	}
	g.drive(1)
	g.requireNoErrors(t)
	require.NotNil(t, first, "rank 0 padded dummy #1")
	require.Equal(t, dummyIDBase, first.ID)
	require.Equal(t, [][]uint64{{1, 0}}, sizes)
	require.Equal(t, []uint64{dummyIDBase}, r0.plan.passes[0].gen, "rank 0 scheduled its dummy")
	require.Empty(t, r1.plan.passes[0].gen, "rank 1 scheduled nothing")
	require.Equal(t, []uint64{5}, activeIDs(r0.ex), "dummy #1 removed from active")
	require.Nil(t, r0.ex.dummy)
	require.False(t, r0.pool.HasCache(dummyIDBase), "dummy #1 freed")
	require.Equal(t, r0.pool.TotalPages(), r0.pool.FreePages())
	require.Zero(t, r0.ex.res.ForwardIterations, "the fleet skipped the forward")

	g.drive(1) // second iteration: both ranks pad, sizes [1, 1]
	g.requireNoErrors(t)
	require.Equal(t, []uint64{dummyIDBase + 1}, r0.plan.passes[1].gen)
	require.Equal(t, [][]uint64{{1, 0}, {1, 1}}, sizes)
	require.Equal(t, []uint64{5, dummyIDBase + 1}, activeIDs(r0.ex), "active = [other requests…, dummy #2]")
	second := r0.ex.active[1]
	require.NotSame(t, first, second, "dummy #2 is a new object")
	require.Nil(t, r0.ex.dummy, "dummy #2 committed")
	require.NotNil(t, r0.ex.prev, "the forward was launched")
	require.Equal(t, int64(2), r0.ex.iter)
	g.requireEqualTraces(t)
}

func TestE08RollbackRemovesOnlyThePendingDummy(t *testing.T) {
	e, kv, pool := unitExec(t, 0, 2, 16, nccl.NewLocalGroup(2, nccl.LocalOptions{})[0])
	e.padDummy()
	older := e.dummy
	require.Equal(t, dummyIDBase, older.ID)
	// Commit it (can_queue was true) and launch it: it leaves the window.
	e.dummy = nil
	older.State = scheduler.GenerationToComplete
	e.padDummy()
	require.Equal(t, dummyIDBase+1, e.dummy.ID)
	require.Equal(t, []uint64{dummyIDBase, dummyIDBase + 1}, activeIDs(e))
	e.rollbackDummy()
	require.Equal(t, []uint64{dummyIDBase}, activeIDs(e), "only 2^63+1 removed")
	require.True(t, pool.HasCache(dummyIDBase), "the committed dummy keeps its KV")
	require.False(t, pool.HasCache(dummyIDBase+1))
	require.Len(t, kv.frees, 1)
	require.Equal(t, dummyIDBase+1, kv.frees[0].id)
	require.Nil(t, e.dummy)
	e.rollbackDummy() // nothing pending: no-op
	require.Len(t, kv.frees, 1)
	require.Equal(t, []uint64{dummyIDBase}, activeIDs(e))
}

// E-09: this executor has no per-slot resource outside the step descriptor
// it rebuilds every iteration, so "terminate normally" is exactly releasing
// the KV once and dropping the request; a slot number on the dummy changes
// nothing (no double free, no leak).
func TestE09RollbackWithBatchSlot(t *testing.T) {
	e, kv, pool := unitExec(t, 0, 2, 16, nccl.NewLocalGroup(2, nccl.LocalOptions{})[0])
	e.padDummy()
	e.dummy.BatchIndex = 3
	e.rollbackDummy()
	require.Empty(t, e.active)
	require.Len(t, kv.frees, 1, "released exactly once")
	require.Equal(t, pool.TotalPages(), pool.FreePages())
	require.NoError(t, pool.CheckInvariants())
}

// ---------------------------------------------------------------------------
// E-10, E-11: canQueue and the revert of generation allocations
// ---------------------------------------------------------------------------

func TestE10CanQueueTruthTable(t *testing.T) {
	for _, c := range []struct {
		b                 [2]int
		canQueue, thisOne [2]bool
	}{
		{[2]int{1, 1}, [2]bool{true, true}, [2]bool{true, true}},    // every rank b > 0
		{[2]int{3, 0}, [2]bool{false, false}, [2]bool{true, false}}, // some rank empty
		{[2]int{0, 2}, [2]bool{false, false}, [2]bool{false, true}},
		{[2]int{0, 0}, [2]bool{false, false}, [2]bool{false, false}},
	} {
		comms := nccl.NewLocalGroup(2, nccl.LocalOptions{Timeout: 5 * time.Second})
		var got, mine [2]bool
		var errs [2]error
		onTwo(func(r int) {
			e, _, _ := unitExec(t, r, 2, 4, comms[r])
			got[r], mine[r], errs[r] = e.canQueue(c.b[r])
		})
		require.NoError(t, errors.Join(errs[:]...))
		require.Equal(t, c.canQueue, got, "sizes %v", c.b)
		require.Equal(t, c.thisOne, mine, "sizes %v", c.b)
		require.Equal(t, comms[0].Trace(), comms[1].Trace())
		require.Len(t, comms[0].Trace(), 1)
		require.Equal(t, "allgather:batch_size", comms[0].Trace()[0].String())
	}
	// Without attention DP there is no collective: b > 0 on both outputs.
	e, _, _ := unitExec(t, 0, 1, 4, nil)
	for _, b := range []int{0, 2} {
		cq, mine, err := e.canQueue(b)
		require.NoError(t, err)
		require.Equal(t, b > 0, cq)
		require.Equal(t, b > 0, mine)
	}
}

// E-11: rank 0 schedules two generation requests and a first context chunk;
// rank 1's batch is empty (its dummy cannot be added), so can_queue is
// false: exactly the two generation growths are reverted, the context
// allocation is kept.
func TestE11RevertOnlyGenerationAllocations(t *testing.T) {
	g := (&rig{n: 2, src: &scriptSource{byIter: make([][]Arrival, 100)}}).build(t)
	r0, r1 := g.ranks[0], g.ranks[1]
	a := inject(r0.ex, asGeneration(t, r0.pool, newRequest(arrival(1, 12, 9))))
	b := inject(r0.ex, asGeneration(t, r0.pool, newRequest(arrival(2, 16, 9))))
	c := inject(r0.ex, newRequest(arrival(3, 20, 9)))
	capA, capB := r0.pool.Capacity(a.ID), r0.pool.Capacity(b.ID)
	r1.kv.failAddDummy = 1
	g.drive(1)
	g.requireNoErrors(t)
	p := r0.plan.passes[0]
	require.Equal(t, []uint64{1, 2}, p.gen)
	require.Equal(t, []uint64{3}, p.ctx)
	require.Equal(t, capA+1, p.caps[a.ID], "the scheduler grew A")
	require.Equal(t, []uint64{1, 2}, r0.kv.reverts, "RevertAllocateGeneration called twice")
	require.Equal(t, capA, r0.pool.Capacity(a.ID))
	require.Equal(t, capB, r0.pool.Capacity(b.ID))
	// Deliberate difference from E-11's "context allocations kept": a first
	// chunk that never launched is released like any first chunk that does
	// not end SCHEDULED (revertGeneration; issue 9, defect 1), so a
	// CONTEXT_INIT request never sits on pages no rule can take back.
	require.False(t, r0.pool.HasCache(c.ID), "the unlaunched first chunk is released")
	require.Zero(t, c.ContextPosition)
	require.Zero(t, r0.ex.res.ForwardIterations)
	require.Empty(t, r1.kv.reverts)
	// The next iteration schedules the same chunk again (a fresh admission)
	// and the fleet now runs: rank 1 pads successfully.
	g.drive(1)
	g.requireNoErrors(t)
	require.Equal(t, []uint64{3}, r0.plan.passes[1].ctx)
	require.Equal(t, int64(1), r0.ex.res.ForwardIterations)
	require.Equal(t, []uint64{1, 2}, r0.kv.reverts, "no revert when can_queue is true")
	g.requireEqualTraces(t)
}

// E-12: prepareBatch asserts that every scheduled request's cache is active.
func TestE12PrepareBatchRejectsSuspendedCache(t *testing.T) {
	e, _, pool := unitExec(t, 0, 1, 16, nil)
	r := inject(e, asGeneration(t, pool, newRequest(arrival(1, 8, 4))))
	pool.Suspend(&r.Request)
	require.False(t, pool.IsActive(r.ID))
	_, err := e.prepareBatch(&scheduler.Output{Generation: []*scheduler.Request{&r.Request}}, &plan{})
	require.ErrorContains(t, err, "invariant prepareBatch")
	require.ErrorContains(t, err, "request 1 has no active KV cache")
	_, err = e.prepareBatch(&scheduler.Output{Context: []*scheduler.Request{{ID: 99}}}, &plan{})
	require.ErrorContains(t, err, "scheduled request 99 is not active")
}

// ---------------------------------------------------------------------------
// E-13: lockstep over 16 iterations with empty and busy ranks
// ---------------------------------------------------------------------------

func TestE13IterCounterAndTracesInLockstep(t *testing.T) {
	mixed := 0
	for seed := uint64(0); seed < 6; seed++ {
		for _, overlap := range []bool{false, true} {
			rng := rand.New(rand.NewPCG(seed, 13))
			n := 2 + rng.IntN(3)
			// 16 iteration slots with a few short requests at random
			// iterations: most iterations leave some ranks empty.
			// (17 slots: the shutdown flag comes after the 16 iterations.)
			src := &scriptSource{byIter: make([][]Arrival, 17)}
			id := uint64(0)
			for k := 0; k < 16; k++ {
				for j := rng.IntN(4) - 2; j > 0; j-- {
					src.byIter[k] = append(src.byIter[k], arrival(id, 1+rng.IntN(20), 1+rng.IntN(5)))
					id++
				}
			}
			g := (&rig{n: n, overlap: overlap, src: src}).build(t)
			g.drive(16)
			g.requireNoErrors(t)
			for _, rr := range g.ranks {
				require.Len(t, rr.snaps, 16, "seed %d rank %d", seed, rr.rank)
				for k, s := range rr.snaps {
					require.Equal(t, int64(k+1), s.iter, "iter_counter after iteration %d", k)
					require.Equal(t, g.ranks[0].snaps[k].traceLen, s.traceLen,
						"seed %d overlap %v: rank %d entered a different number of collectives by iteration %d",
						seed, overlap, rr.rank, k)
				}
			}
			g.requireEqualTraces(t)
			for k := 0; k < 16; k++ {
				empty, busy := false, false
				for _, rr := range g.ranks {
					if rr.plan.passes[k].realScheduled == 0 {
						empty = true
					} else {
						busy = true
					}
				}
				if empty && busy {
					mixed++
				}
			}
		}
	}
	require.Positive(t, mixed, "the scenario must mix empty and busy ranks in some iteration")
}

// ---------------------------------------------------------------------------
// E-14: a gathered payload that does not decode
// ---------------------------------------------------------------------------

func TestE14UndecodablePayloadIsCollectiveDesync(t *testing.T) {
	// Unit: every decoder rejects a payload of another collective.
	batchSize := binary.LittleEndian.AppendUint64(nil, 3)
	_, err := decodeResponseBatch(batchSize)
	require.ErrorContains(t, err, "collective desync")
	_, err = decodeResponseBatch(append(responseBatch{}.encode(), 0))
	require.ErrorContains(t, err, "trailing bytes")

	// Loop: rank 1's third response gather carries garbage; rank 0 (which
	// decodes the gather) fails with "collective desync".
	for _, overlap := range []bool{false, true} {
		g := (&rig{n: 2, overlap: overlap, src: allAtOnce(arrival(0, 9, 6), arrival(1, 7, 6))}).build(t)
		calls := 0
		g.ranks[1].hc.send = func(name string, data []byte) []byte {
			if name == "responses" {
				if calls++; calls == 3 {
					return []byte{0xde, 0xad, 0xbe}
				}
			}
			return data
		}
		g.drive(0)
		require.Error(t, g.ranks[0].err)
		require.ErrorContains(t, g.ranks[0].err, "collective desync", "overlap %v", overlap)
		require.ErrorContains(t, g.ranks[0].err, "rank 0")
		require.Nil(t, g.ranks[0].res)
		require.Error(t, g.ranks[1].err, "rank 1 cannot continue past a failed peer")
	}

	// A rank state of 14 values (a longer payload) is a desync on every rank.
	g := (&rig{n: 2, src: allAtOnce(arrival(0, 9, 2))}).build(t)
	g.ranks[1].hc.send = func(name string, data []byte) []byte {
		if name == "rank_state" {
			return append(data, make([]byte, 8)...)
		}
		return data
	}
	g.drive(0)
	for _, rr := range g.ranks {
		require.ErrorContains(t, rr.err, "collective desync", "rank %d", rr.rank)
	}
}

// ---------------------------------------------------------------------------
// E-15: shutdown with active requests
// ---------------------------------------------------------------------------

func TestE15ShutdownDrainsThenEveryRankExitsTogether(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		// The source is exhausted in iteration 5 (its last arrival): the
		// shutdown flag rides that iteration's count broadcast.
		src := &scriptSource{byIter: [][]Arrival{{arrival(0, 20, 12), arrival(1, 9, 15)}, nil,
			{arrival(2, 30, 10)}, nil, nil, {arrival(3, 5, 12)}}}
		g := (&rig{n: 3, overlap: overlap, src: src}).build(t)
		g.drive(0)
		g.requireNoErrors(t)
		g.requireEqualTraces(t)
		out := g.outputs(t)
		require.Len(t, out, 4, "every request answered")
		for id, r := range out {
			require.Empty(t, r.Error, "request %d", id)
		}
		iters := g.ranks[0].res.Iterations
		require.Greater(t, iters, int64(6), "the loop continues after the shutdown until drained")
		for _, rr := range g.ranks {
			require.Equal(t, iters, rr.res.Iterations, "rank %d exits in the same iteration", rr.rank)
			for k, s := range rr.snaps {
				require.Equal(t, k >= 5, s.shutdown, "rank %d iteration %d: shutdown seen from iteration 5 on", rr.rank, k)
			}
			require.Positive(t, rr.snaps[5].active+rr.snaps[6].active, "rank %d", rr.rank)
			require.Empty(t, rr.ex.active, "rank %d", rr.rank)
			require.Zero(t, rr.ex.waiting.Len(), "rank %d: the waiting queue drained", rr.rank)
		}
		busyAfterShutdown := 0
		for _, rr := range g.ranks {
			busyAfterShutdown += rr.snaps[5].active
		}
		require.Positive(t, busyAfterShutdown, "requests were active when the shutdown arrived")
		g.requireNoLeaks(t)
	}
}

// E-16 (crash with waiters) does not apply: this executor has no response
// waiters; Run returns the responses (rank 0) or the error to its caller, and
// the worker (cmd/worker) owns teardown.
//
// E-18 (TLLM_PROFILE_LOG_RANKS selection) is implemented and tested in
// cmd/worker (openIterLogs); the executor only writes to the sink it is given.

// ---------------------------------------------------------------------------
// E-17: arrival validation with chunking off
// ---------------------------------------------------------------------------

func TestE17PromptOverMaxNumTokensWithoutChunking(t *testing.T) {
	sc := defaultSched()
	sc.ChunkedContext, sc.MaxNumTokens = false, 8192
	g := (&rig{n: 2, sc: sc, pages: 1200, src: allAtOnce(arrival(0, 9000, 4), arrival(1, 10, 4))}).build(t)
	var atC8, atC7 []Response
	g.ranks[0].hc.recv = func(name string, all [][]byte) {
		if name != "pending_responses" && name != "responses" {
			return
		}
		for _, b := range all {
			rb, err := decodeResponseBatch(b)
			if err != nil {
				t.Errorf("gather %s: %v", name, err)
				return
			}
			switch name {
			case "pending_responses":
				atC8 = append(atC8, rb.Responses...)
			case "responses":
				atC7 = append(atC7, rb.Responses...)
			}
		}
	}
	g.drive(0)
	g.requireNoErrors(t)
	g.requireEqualTraces(t)
	out := g.outputs(t)
	require.Len(t, out, 2)
	require.Contains(t, out[0].Error, "prompt of 9000 tokens exceeds max_num_tokens 8192 and chunked prefill is off")
	require.Empty(t, out[0].Output)
	require.Empty(t, out[1].Error)
	require.Len(t, out[1].Output, 4)
	require.Len(t, atC8, 1, "the rejection is flushed at C8")
	require.Equal(t, uint64(0), atC8[0].ID)
	for _, r := range atC7 {
		require.NotEqual(t, uint64(0), r.ID, "a rejection never goes through C7")
	}
	for _, rr := range g.ranks {
		for _, p := range rr.plan.passes {
			require.NotContains(t, p.active, uint64(0), "rank %d: the rejected request entered active", rr.rank)
		}
	}
}

// ---------------------------------------------------------------------------
// E-19: overlap-loop iteration records
// ---------------------------------------------------------------------------

// stampEngine gives the k-th launched step device time 10·(k+1) ms so each
// record's device_ms identifies its iteration.
type stampEngine struct {
	bridge.Engine
	launched, waited int
}

func (s *stampEngine) Submit(d *bridge.StepDesc) error { s.launched++; return s.Engine.Submit(d) }
func (s *stampEngine) Wait(res *bridge.StepResult) error {
	err := s.Engine.Wait(res)
	s.waited++
	res.DeviceMS = float64(10 * s.waited)
	return err
}

func TestE19OverlapRecordsWrittenOneIterationLate(t *testing.T) {
	g := (&rig{n: 1, overlap: true, src: allAtOnce(arrival(0, 8, 3)),
		wrapEng: func(_ int, e bridge.Engine) bridge.Engine { return &stampEngine{Engine: e} }}).build(t)
	var linesAfter []int
	g.after = func(rr *rigRank) { linesAfter = append(linesAfter, len(rr.log.lines)) }
	g.drive(0)
	g.requireNoErrors(t)
	rr := g.ranks[0]
	var recs []IterRecord
	for _, line := range rr.log.lines {
		var rec IterRecord
		require.NoError(t, json.Unmarshal(line, &rec))
		recs = append(recs, rec)
	}
	// Iterations 0, 1, 2 launch (prefill + two decodes); iteration 3 has no
	// forward and processes the last batch.
	require.GreaterOrEqual(t, len(recs), 3)
	for k := 0; k < 3; k++ {
		require.Equal(t, int64(k), recs[k].Iter)
		require.True(t, recs[k].CanQueue)
		require.NotNil(t, recs[k].DeviceMS)
		require.Equal(t, float64(10*(k+1)), *recs[k].DeviceMS, "iteration %d carries its own device time", k)
	}
	require.Equal(t, 0, linesAfter[0], "iteration 0's record is not written during iteration 0")
	require.Equal(t, 1, linesAfter[1], "iteration 0's record is written during iteration 1")
	require.Equal(t, 2, linesAfter[2], "iteration 1's record is written during iteration 2")
	for _, rec := range recs[3:] {
		require.False(t, rec.CanQueue)
		require.Nil(t, rec.DeviceMS, "an iteration without a forward has device_ms null")
	}
	require.Equal(t, []int64{0, 1, 2}, []int64{recs[0].Iter, recs[1].Iter, recs[2].Iter})
	require.Equal(t, 3, rr.eng.(*stampEngine).launched)
}

// The empty batch (no deltas, no responses) is read by a fast path: it must
// give what the general decoder gives, and a batch of that size whose counts
// are not zero must still go through the general one.
func TestEmptyResponseBatchFastPath(t *testing.T) {
	rb := responseBatch{DeviceUS: 1234, Tokens: 56,
		Load: RankLoad{Running: 1, Waiting: 2, UsedPages: 3, Pages: 4, Suspended: 5, Recompute: 6}}
	b := rb.encode()
	require.Len(t, b, emptyResponseBatch)
	got, err := decodeResponseBatch(b)
	require.NoError(t, err)
	require.Equal(t, rb, got)
	// With one delta the general decoder reads the same header.
	rb.Deltas = []TokenDelta{{ID: 7, Token: 8}}
	back, err := decodeResponseBatch(rb.encode())
	require.NoError(t, err)
	require.Equal(t, rb, back)
	// Counts that are not zero at the empty size: a short payload.
	bad := slices.Clone(b)
	binary.LittleEndian.PutUint32(bad[emptyResponseBatch-4:], 1)
	_, err = decodeResponseBatch(bad)
	require.Error(t, err)
}
