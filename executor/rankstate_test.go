package executor

// Rank state (router-and-calibration.md §1.2, rows RS-05 … RS-13 of §6.1):
// the 13 × int64 wire format of the C1 allgather, its defaults and
// validation, how the executor fills it, and the statistics piggyback
// (executor.md §13.3).

import (
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/router"
)

// wire encodes int64 values as the C1 payload does.
func wire(v ...int64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// unwire decodes a C1 payload into its int64 values.
func unwire(t *testing.T, b []byte) []int64 {
	t.Helper()
	require.Zero(t, len(b)%8)
	v := make([]int64, len(b)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return v
}

func TestRankStateWireFormat(t *testing.T) {
	t.Run("RS-05 serialize (0, 5, 100)", func(t *testing.T) {
		// Through the executor: five live requests whose prompts sum to 100
		// tokens, no statistics yet.
		e, _, _ := unitExec(t, 0, 1, 64, nil)
		for i, n := range []int{10, 20, 30, 15, 25} {
			inject(e, newRequest(arrival(uint64(i), n, 2)))
		}
		require.Equal(t, []int64{0, 5, 100, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}, unwire(t, e.rankState().encode()))
		require.Len(t, e.rankState().encode(), 8*RankStateLen)
	})

	t.Run("RS-06 deserialize [2,3,50] pads defaults", func(t *testing.T) {
		s, err := decodeRankState(wire(2, 3, 50))
		require.NoError(t, err)
		require.Equal(t, RankState{Rank: 2, ActiveRequests: 3, ActiveTokens: 50, StatsIter: -1}, s)
		require.False(t, s.HasStats)
		// Every shorter prefix pads the same way.
		for n := 1; n <= RankStateLen; n++ {
			full := []int64{1, 2, 3, 4, 1, 6, 7, 8, 9, 10, 11, 12, 13}
			s, err := decodeRankState(wire(full[:n]...))
			require.NoError(t, err, "%d values", n)
			want := []int64{0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}
			copy(want, full[:n])
			require.Equal(t, want, unwire(t, s.encode()), "%d values", n)
		}
	})

	t.Run("RS-07 round trip with retiring and stats", func(t *testing.T) {
		in := RankState{Rank: 3, ActiveRequests: 4, ActiveTokens: 900, RetiringRequests: 3, HasStats: true,
			StatsIter: 41, CtxRequests: 2, CtxTokens: 640, GenRequests: 5, GenTokens: 5, CostS: 123456,
			HostUS: 789, PausedAndRecomp: 1}
		out, err := decodeRankState(in.encode())
		require.NoError(t, err)
		require.Equal(t, in, out)
		require.Equal(t, []int64{3, 4, 900, 3, 1, 41, 2, 640, 5, 5, 123456, 789, 1}, unwire(t, in.encode()),
			"field order of §1.2")
	})

	t.Run("RS-08 longer or malformed payloads are rejected", func(t *testing.T) {
		_, err := decodeRankState(wire(make([]int64, 14)...))
		require.ErrorContains(t, err, "collective desync")
		_, err = decodeRankState(nil)
		require.Error(t, err, "an empty payload has no rank")
		_, err = decodeRankState(make([]byte, 12))
		require.Error(t, err, "not a multiple of 8 bytes")
	})
}

func TestRankStateCounts(t *testing.T) {
	e, _, _ := unitExec(t, 2, 4, 64, nccl.NewLocalGroup(4, nccl.LocalOptions{})[2])
	// RS-09: prompts 100 and 200.
	a := inject(e, newRequest(arrival(1, 100, 2)))
	inject(e, newRequest(arrival(2, 200, 2)))
	s := e.rankState()
	require.Equal(t, [3]int64{2, 2, 300}, [3]int64{s.Rank, s.ActiveRequests, s.ActiveTokens})
	// RS-10: 100 live + 200 and 300 retiring; a dummy never counts.
	e.active[1].State = scheduler.GenerationToComplete
	r3 := inject(e, newRequest(arrival(3, 300, 2)))
	r3.State = scheduler.GenerationToComplete
	inject(e, newDummy(dummyIDBase))
	s = e.rankState()
	require.Equal(t, [3]int64{1, 100, 2}, [3]int64{s.ActiveRequests, s.ActiveTokens, s.RetiringRequests})
	// Tokens are the original prompt at arrival, also after a recompute reset.
	a.State, a.output, a.Generated = scheduler.GenerationInProgress, []int32{7, 8, 9}, 3
	a.resetForRecompute()
	require.Equal(t, 103, a.PromptLen)
	require.Equal(t, int64(100), e.rankState().ActiveTokens)
	// RS-11: retiring only.
	e.remove(a)
	s = e.rankState()
	require.Equal(t, [3]int64{0, 0, 2}, [3]int64{s.ActiveRequests, s.ActiveTokens, s.RetiringRequests})
}

// RS-12: the allgather returns [0,1,10] and [1,2,20]; each rank sends its own
// state and both get the two states, indexed by their rank field — also
// when the transport hands the payloads back in another order.
func TestRankStateAllgather(t *testing.T) {
	for _, reversed := range []bool{false, true} {
		comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
		var got [2][]RankState
		var sent [2][]int64
		var errs [2]error
		onTwo(func(r int) {
			hc := &hookComm{LocalComm: comms[r]}
			hc.send = func(_ string, data []byte) []byte { sent[r] = unwire(t, data); return data }
			if reversed {
				hc.reorder = func(_ string, all [][]byte) [][]byte { return [][]byte{all[1], all[0]} }
			}
			e, _, _ := unitExec(t, r, 2, 64, hc)
			for i := 0; i <= r; i++ { // rank 0: one request of 10; rank 1: two of 10
				inject(e, newRequest(arrival(uint64(10*r+i), 10, 2)))
			}
			got[r], _, errs[r] = e.gatherRankStates(nil)
		})
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.Equal(t, []int64{0, 1, 10}, sent[0][:3], "the local state (0,1,10) was sent")
		require.Equal(t, []int64{1, 2, 20}, sent[1][:3])
		for r := 0; r < 2; r++ {
			require.Len(t, got[r], 2)
			require.Equal(t, [3]int64{0, 1, 10}, [3]int64{got[r][0].Rank, got[r][0].ActiveRequests, got[r][0].ActiveTokens}, "reversed %v", reversed)
			require.Equal(t, [3]int64{1, 2, 20}, [3]int64{got[r][1].Rank, got[r][1].ActiveRequests, got[r][1].ActiveTokens}, "reversed %v", reversed)
		}
		require.Equal(t, comms[0].Trace(), comms[1].Trace())
		require.Equal(t, "allgather:rank_state", comms[0].Trace()[0].String())
	}

	// A state naming a rank outside the group is a desync.
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
	var errs [2]error
	onTwo(func(r int) {
		hc := &hookComm{LocalComm: comms[r]}
		if r == 1 {
			hc.send = func(_ string, _ []byte) []byte { return wire(5) }
		}
		e, _, _ := unitExec(t, r, 2, 64, hc)
		_, _, errs[r] = e.gatherRankStates(nil)
	})
	for r := range errs {
		require.ErrorContains(t, errs[r], "collective desync")
		require.ErrorContains(t, errs[r], "names rank 5")
	}
}

// RS-13 / executor.md §13.3: the state gathered in iteration j+1 carries the
// rank's statistics of iteration j in slots 4–12; the first state has none.
func TestRankStateCarriesPreviousIterationStats(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		reqs := []Arrival{arrival(0, 30, 6), arrival(1, 70, 3), arrival(2, 12, 9), arrival(3, 40, 4)}
		g := (&rig{n: 2, overlap: overlap, src: allAtOnce(reqs...)}).build(t)
		sent := make([][][]int64, 2) // per rank, per iteration
		for _, rr := range g.ranks {
			rr := rr
			rr.hc.send = func(name string, data []byte) []byte {
				if name == "rank_state" {
					// Rank 0's state carries the intake after it
					// (gatherStatesAndArrivals).
					sent[rr.rank] = append(sent[rr.rank], unwire(t, data[:min(len(data), 8*RankStateLen)]))
				}
				return data
			}
		}
		g.drive(0)
		g.requireNoErrors(t)
		for _, rr := range g.ranks {
			recs := map[int64]IterRecord{}
			for _, line := range rr.log.lines {
				var rec IterRecord
				require.NoError(t, json.Unmarshal(line, &rec))
				recs[rec.Iter] = rec
			}
			states := sent[rr.rank]
			require.Equal(t, int(rr.res.Iterations)+1, len(states), "one state per iteration, the exit one included")
			require.Equal(t, []int64{0, -1, 0, 0, 0, 0, 0, 0, 0}, states[0][4:], "no stats before iteration 0")
			for j := 0; j+1 < len(states); j++ {
				v, rec := states[j+1], recs[int64(j)]
				require.Equal(t, int64(rr.rank), v[0])
				require.Equal(t, int64(1), v[4], "has_stats")
				require.Equal(t, int64(j), v[5], "stats_iter")
				require.Equal(t, []int64{int64(rec.NumCtxRequests), int64(rec.CtxTokens), int64(rec.NumGenRequests),
					int64(rec.GenTokens), int64(rec.CostS)}, v[6:11], "rank %d iteration %d (overlap %v)", rr.rank, j, overlap)
				require.GreaterOrEqual(t, v[11], int64(0), "host wall time")
				require.Equal(t, int64(rec.NumPaused+rec.NumRecomputePaused), v[12])
			}
		}
	}
}

// With least_prefill placement (issue 25 item 6) the rank state carries a
// 14th value, the rank's prompt tokens not yet in KV, which the router
// reads; with any other placement the state is the spec's 13 values and
// the pending prefill is not computed.
func TestRankStatePendingPrefill(t *testing.T) {
	leastPrefill := func(c *Config) {
		r, err := router.New(router.NameConversation, router.Config{MaxActivePerRank: 64,
			NewConvPlacement: router.PlacementLeastPrefill})
		require.NoError(t, err)
		c.Router = r
	}
	fill := func(e *Executor) {
		inject(e, newRequest(arrival(1, 100, 2))) // waiting: its whole prompt
		mid := inject(e, newRequest(arrival(2, 100, 2)))
		mid.State, mid.ContextPosition = scheduler.ContextInProgress, 40 // 60 left
		gen := inject(e, newRequest(arrival(3, 50, 2)))
		gen.State, gen.ContextPosition = scheduler.GenerationInProgress, 50
		done := inject(e, newRequest(arrival(4, 70, 2)))
		done.State = scheduler.GenerationToComplete
		inject(e, newDummy(dummyIDBase))
	}

	e, _, _ := unitExecWith(t, 0, 1, 64, nil, leastPrefill)
	require.Equal(t, rankStateLenPrefill, e.stateLen)
	fill(e)
	s := e.rankState()
	require.Equal(t, int64(160), s.PendingPrefill, "100 waiting + 60 left of a chunked prompt; generation, retiring and dummy count nothing")
	require.Equal(t, [3]int64{3, 250, 1}, [3]int64{s.ActiveRequests, s.ActiveTokens, s.RetiringRequests})
	v := unwire(t, s.appendTo(nil, e.stateLen))
	require.Len(t, v, 14)
	require.Equal(t, int64(160), v[13])
	back, err := decodeRankStateN(s.appendTo(nil, e.stateLen), e.stateLen)
	require.NoError(t, err)
	require.Equal(t, s, back)

	plain, _, _ := unitExec(t, 0, 1, 64, nil)
	require.Equal(t, RankStateLen, plain.stateLen, "the default router: the spec's 13 values")
	fill(plain)
	require.Zero(t, plain.rankState().PendingPrefill, "not computed when no router reads it")

	// Two ranks gather the 14 values; rank 0's intake still rides after its
	// state and comes back whole.
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
	var got [2][]RankState
	var tails [2][]byte
	var sent [2]int
	var errs [2]error
	intake := wire(7, 8, 9)
	onTwo(func(r int) {
		hc := &hookComm{LocalComm: comms[r]}
		hc.send = func(_ string, data []byte) []byte { sent[r] = len(data); return data }
		e, _, _ := unitExecWith(t, r, 2, 64, hc, leastPrefill)
		inject(e, newRequest(arrival(uint64(10+r), 30+10*r, 2)))
		var in []byte
		if r == 0 {
			in = intake
		}
		got[r], tails[r], errs[r] = e.gatherRankStates(in)
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, [2]int{8*14 + len(intake), 8 * 14}, sent)
	for r := range 2 {
		require.Equal(t, []int64{30, 40}, []int64{got[r][0].PendingPrefill, got[r][1].PendingPrefill})
		require.Equal(t, intake, tails[r])
	}

	// A state longer than the fleet's is a desync either way.
	for _, withPrefill := range []bool{false, true} {
		comms := nccl.NewLocalGroup(2, nccl.LocalOptions{})
		var errs [2]error
		onTwo(func(r int) {
			hc := &hookComm{LocalComm: comms[r]}
			if r == 1 {
				hc.send = func(_ string, _ []byte) []byte { return wire(1, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0) }
			}
			var edit func(*Config)
			if withPrefill {
				edit = leastPrefill
			}
			e, _, _ := unitExecWith(t, r, 2, 64, hc, edit)
			_, _, errs[r] = e.gatherRankStates(nil)
		})
		for r := range errs {
			require.ErrorContains(t, errs[r], "collective desync", "least_prefill %v", withPrefill)
		}
	}
}
