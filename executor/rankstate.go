package executor

import (
	"encoding/binary"
	"fmt"
)

// RankStateLen is the number of int64 fields of a rank state
// (router-and-calibration.md §1.2).
const RankStateLen = 13

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
}

func (s RankState) encode() []byte {
	has := int64(0)
	if s.HasStats {
		has = 1
	}
	v := [RankStateLen]int64{s.Rank, s.ActiveRequests, s.ActiveTokens, s.RetiringRequests, has,
		s.StatsIter, s.CtxRequests, s.CtxTokens, s.GenRequests, s.GenTokens, s.CostS, s.HostUS,
		s.PausedAndRecomp}
	b := make([]byte, 0, 8*RankStateLen)
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// decodeRankState pads missing trailing fields with their defaults and
// rejects a longer payload.
func decodeRankState(b []byte) (RankState, error) {
	if len(b)%8 != 0 || len(b) > 8*RankStateLen || len(b) < 8 {
		return RankState{}, fmt.Errorf("collective desync: rank state of %d bytes (want 8..%d, a multiple of 8)", len(b), 8*RankStateLen)
	}
	v := [RankStateLen]int64{5: -1}
	for i := 0; i < len(b)/8; i++ {
		v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return RankState{Rank: v[0], ActiveRequests: v[1], ActiveTokens: v[2], RetiringRequests: v[3],
		HasStats: v[4] != 0, StatsIter: v[5], CtxRequests: v[6], CtxTokens: v[7], GenRequests: v[8],
		GenTokens: v[9], CostS: v[10], HostUS: v[11], PausedAndRecomp: v[12]}, nil
}
