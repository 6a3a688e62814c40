package executor

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// RankStateLen is the number of int64 fields of a rank state
// (router-and-calibration.md §1.2).
const RankStateLen = 13

// rankStateLenPrefill is a rank state's length when the router reads the
// ranks' pending prefill (least_prefill placement): a 14th value,
// PendingPrefill, follows the spec's 13. An extension of lockstep's (the
// spec's wire has 13 values); with any other placement the state is the
// spec's.
const rankStateLenPrefill = RankStateLen + 1

// RankState is one rank's contribution to the per-iteration state allgather.
type RankState struct {
	Rank             int64
	ActiveRequests   int64 // dummies and retiring requests excluded
	ActiveTokens     int64 // Σ original prompt lengths of the counted requests
	RetiringRequests int64
	HasStats         bool
	StatsIter        int64 // -1 when no stats
	CtxRequests      int64 // stats of iteration StatsIter
	CtxTokens        int64
	GenRequests      int64
	GenTokens        int64
	CostS            int64
	HostUS           int64
	PausedAndRecomp  int64
	// PendingPrefill (the 14th value, sent only with least_prefill
	// placement): Σ prompt tokens not yet in KV over the counted requests.
	PendingPrefill int64
}

// encode is the spec's wire form (RankStateLen values).
func (s RankState) encode() []byte { return s.appendTo(nil, RankStateLen) }

// appendTo appends the wire form of s to b: its first n values
// (RankStateLen, or rankStateLenPrefill with the pending prefill).
func (s RankState) appendTo(b []byte, n int) []byte {
	has := int64(0)
	if s.HasStats {
		has = 1
	}
	v := [rankStateLenPrefill]int64{s.Rank, s.ActiveRequests, s.ActiveTokens, s.RetiringRequests, has,
		s.StatsIter, s.CtxRequests, s.CtxTokens, s.GenRequests, s.GenTokens, s.CostS, s.HostUS,
		s.PausedAndRecomp, s.PendingPrefill}
	b = slices.Grow(b, 8*n)
	for _, x := range v[:n] {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// decodeRankState decodes a spec rank state (at most RankStateLen values):
// missing trailing fields take their defaults, a longer payload is a
// desync.
func decodeRankState(b []byte) (RankState, error) { return decodeRankStateN(b, RankStateLen) }

// decodeRankStateN is decodeRankState for states of at most n values
// (rankStateLenPrefill with least_prefill placement).
func decodeRankStateN(b []byte, n int) (RankState, error) {
	if len(b)%8 != 0 || len(b) > 8*n || len(b) < 8 {
		return RankState{}, fmt.Errorf("collective desync: rank state of %d bytes (want 8..%d, a multiple of 8)", len(b), 8*n)
	}
	v := [rankStateLenPrefill]int64{5: -1}
	for i := 0; i < len(b)/8; i++ {
		v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return RankState{Rank: v[0], ActiveRequests: v[1], ActiveTokens: v[2], RetiringRequests: v[3],
		HasStats: v[4] != 0, StatsIter: v[5], CtxRequests: v[6], CtxTokens: v[7], GenRequests: v[8],
		GenTokens: v[9], CostS: v[10], HostUS: v[11], PausedAndRecomp: v[12], PendingPrefill: v[13]}, nil
}

// gatherRankStates is C1: every rank's state, indexed by its rank field.
// Rank 0's may carry the iteration's intake after it (intake, from rank 0;
// nil elsewhere), which every rank gets back as tail (nil when none rode).
func (e *Executor) gatherRankStates(intake []byte) (states []RankState, tail []byte, err error) {
	mine := e.rankState()
	if !e.adp() {
		e.ownState[0] = mine
		return e.ownState[:], nil, nil
	}
	t := e.waitStart()
	e.wire = mine.appendTo(e.wire[:0], e.stateLen)
	if e.slots != nil {
		g, err := e.putRankState(intake)
		if err == nil {
			_, err = e.d.Comm.AllGather("rank_state", nil)
		}
		e.waitEnd(t)
		if err != nil {
			return nil, nil, err
		}
		return g.states, g.intake, nil
	}
	e.wire = append(e.wire, intake...)
	v, err := e.allGatherDecoded("rank_state", e.wire, e.decodeStates)
	e.waitEnd(t)
	if err != nil {
		return nil, nil, err
	}
	g := v.(*gatheredStates) // shared with the other ranks of a coroutine fleet: read-only
	return g.states, g.intake, nil
}

// fleetSlots is C1's result shared by the members of an in-process
// coroutine fleet (nccl.SharedGatherer.Shared). Each member puts its own
// state, decoded from what its wire payload would carry, and rank 0 the
// intake, on the member's own thread before it enters C1; the collective
// then only synchronises, where its completion would decode every member's
// state alone while the other threads wait (issue 24 item 8). Two results
// are used in turn, each member switching at each C1 of its own: a member
// is at most one collective ahead of any other, so when it writes a half
// again (two C1s later) every member has passed the C1 in between and
// reads the other half.
//
// costs are the ranks' step costs for C7 on a virtual clock, put the same
// way when the engine can cost a fleet from them (slotCoster): a member
// puts its own before it enters C7, and C7's completion, when every member
// has put its own and none can put the next, reads them all.
type fleetSlots struct {
	states [2]gatheredStates
	costs  []twin.StepCost
}

func newFleetSlots(ranks int) *fleetSlots {
	s := &fleetSlots{costs: make([]twin.StepCost, ranks)}
	for i := range s.states {
		s.states[i].states = make([]RankState, ranks)
	}
	return s
}

// putRankState puts this member's state (e.wire, encoded) and, on rank 0,
// a copy of the intake into its turn's shared C1 result.
func (e *Executor) putRankState(intake []byte) (*gatheredStates, error) {
	g := &e.slots.states[e.slotTurn]
	e.slotTurn ^= 1
	s, err := decodeRankStateN(e.wire, e.stateLen)
	if err != nil {
		return nil, err
	}
	g.states[e.cfg.Rank] = s
	if e.cfg.Rank == 0 {
		g.intake = nil
		if len(intake) > 0 {
			g.intake = slices.Clone(intake) // decoded arrivals keep their prompt bytes
		}
	}
	return g, nil
}

// gatheredStates is C1's decoded result: the states by rank and the intake
// that rode rank 0's state (a copy: the gathered buffers are reused, and
// decoded arrivals keep their prompt bytes).
type gatheredStates struct {
	states []RankState
	intake []byte
}

// decodeRankStates decodes the gathered rank states, indexed by their rank
// field. It reads only its argument (and the configured rank count), so a
// coroutine fleet runs it once for every rank. Rank 0's state may be
// followed by the intake (gatherStatesAndArrivals); any other longer state
// is a desync. A state is e.stateLen values long (the same on every rank:
// it follows the fleet's router configuration).
func (e *Executor) decodeRankStates(all [][]byte) (any, error) {
	g := &e.statesBuf[e.statesTurn]
	e.statesTurn ^= 1
	if len(g.states) != e.cfg.Ranks {
		g.states = make([]RankState, e.cfg.Ranks)
	}
	clear(g.states)
	g.intake = nil
	for i, b := range all {
		if n := 8 * e.stateLen; len(b) > n && binary.LittleEndian.Uint64(b) == 0 {
			g.intake = slices.Clone(b[n:])
			b = b[:n]
		}
		s, err := decodeRankStateN(b, e.stateLen)
		if err != nil {
			return nil, err
		}
		if s.Rank < 0 || int(s.Rank) >= e.cfg.Ranks {
			return nil, fmt.Errorf("collective desync: rank state from member %d names rank %d", i, s.Rank)
		}
		g.states[s.Rank] = s
	}
	return g, nil
}

// rankState is this rank's contribution to C1: its loads now (dummies left
// out, retiring requests counted apart) and the statistics of its last
// iteration (§13.3).
func (e *Executor) rankState() RankState {
	s := e.lastStats
	s.Rank = int64(e.cfg.Rank)
	s.ActiveRequests, s.ActiveTokens, s.RetiringRequests, s.PendingPrefill = 0, 0, 0, 0
	prefill := e.stateLen > RankStateLen
	for _, r := range e.active {
		if r.IsDummy {
			continue
		}
		if r.State == scheduler.GenerationToComplete {
			s.RetiringRequests++
			continue
		}
		s.ActiveRequests++
		s.ActiveTokens += int64(len(r.prompt))
		if prefill && r.State.IsContext() {
			s.PendingPrefill += int64(r.Remaining())
		}
	}
	return s
}
