package executor

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// Serving hooks: what an online server on rank 0 needs beyond a trace
// replay. Tokens stream to rank 0 as they are produced (Config.Stream,
// Config.OnTokens), every answer is handed over when it is known
// (Config.OnResponse), the fleet's load is reported every iteration
// (Config.OnIteration), and a client's cancellation reaches every rank at
// the same program point (Canceller): the arrival broadcast carries it, so
// every rank drops the request in the same iteration and frees its pages.

// Canceller is implemented by a Source whose requests can be withdrawn.
type Canceller interface {
	// Cancelled returns the ids withdrawn since the last call. It is called
	// right after Due, and the ranks withdraw before they admit Due's
	// arrivals: an id first handed out by that same Due call must be
	// returned by a later call instead (or never handed out). An id that
	// already finished is ignored.
	Cancelled() []uint64
}

// CancelledError is the Error of the response of a cancelled request.
const CancelledError = "cancelled"

// FleetStats is rank 0's view of one iteration (Config.OnIteration).
type FleetStats struct {
	Iter    int64
	Forward bool // the fleet ran a forward step
	// BusyMS is each rank's engine time in the iteration (nil without a
	// forward); LockstepWaste is 1 − mean/max of it.
	BusyMS        []float64
	LockstepWaste float64
	// TokensPerRank is each rank's real tokens in that forward (padding
	// dummies count 0; nil without a forward) and TokenBalance mean/max
	// of it (0 when no rank had a token).
	TokensPerRank []int64
	TokenBalance  float64
	// ContextsHeld says ADP Balance held back the contexts some rank had
	// scheduled in this iteration (Config.ADPBalance).
	ContextsHeld bool
	// Ranks is each rank's load at the iteration's end (rank order; one
	// entry without attention DP).
	Ranks []RankLoad
	// IterationMS is the iteration's wall time on rank 0.
	IterationMS float64
	// CostPublications counts the online calibrator's publications so far.
	CostPublications int
	// Queued is the requests received and not routed to a rank yet (the
	// waiting queue beyond Config.MaxActivePerRank, the same on every
	// rank), at the iteration's end.
	Queued int
}

// load is this rank's RankLoad now. Used pages are those sequences hold:
// cached pages no sequence references are evictable on demand and count as
// free, as vLLM's kv_cache_usage_perc counts its cached blocks with no
// reference (its free queue holds them) and as the iteration log's kv_util.
func (e *Executor) load() RankLoad {
	kv := e.d.KV
	l := RankLoad{UsedPages: int64(kv.TotalPages() - kv.FreePages() - kv.CachedPages()), Pages: int64(kv.TotalPages()),
		Suspended: e.suspends, Recompute: e.recomputes}
	for _, r := range e.active {
		switch {
		case r.IsDummy || r.State == scheduler.Complete:
		case r.State == scheduler.ContextInit:
			l.Waiting++
		case !kv.IsActive(r.ID):
			// Suspended to the host tier: no batch slot until it resumes
			// (vLLM counts a preempted request waiting).
			l.Waiting++
		default:
			l.Running++
		}
	}
	return l
}

// reportIteration hands the iteration's fleet state to Config.OnIteration.
func (e *Executor) reportIteration(p *plan) {
	st := FleetStats{Iter: e.iter, Forward: len(e.iterBusy) > 0, Ranks: append([]RankLoad(nil), e.iterLoads...),
		IterationMS: float64(e.wall().Sub(p.wallStart).Microseconds()) / 1000, CostPublications: len(e.res.CostPublications),
		Queued: e.waiting.Len()}
	if st.Forward {
		st.BusyMS = append([]float64(nil), e.iterBusy...)
		var sum, max float64
		for _, b := range st.BusyMS {
			sum += b
			max = math.Max(max, b)
		}
		if max > 0 {
			st.LockstepWaste = 1 - sum/float64(len(st.BusyMS))/max
		}
		st.TokensPerRank = append([]int64(nil), e.iterTokens...)
		st.TokenBalance = tokenBalance(st.TokensPerRank)
	}
	st.ContextsHeld = p.held
	e.cfg.OnIteration(st)
}

// cancelRequests withdraws ids on this rank (every rank runs it at the same
// point, with the same ids). A request in a launched step that has not come
// back yet completes when it does (its tokens are dropped).
func (e *Executor) cancelRequests(ids []uint64) {
	now := e.cfg.Clock().UnixNano()
	removed := false
	var queued map[uint64]bool // ids in the queue, routed to no rank yet
	for _, id := range ids {
		r := e.request(id)
		if r == nil && e.waiting.Has(id) {
			if queued == nil {
				queued = make(map[uint64]bool)
			}
			queued[id] = true
		}
		if r == nil || r.IsDummy || r.State == scheduler.Complete {
			continue
		}
		r.cancelled, r.stopped = true, true
		r.State = scheduler.GenerationToComplete // out of the scheduling window
		if r.pending == 0 {
			e.complete(r, now)
			removed = true
		}
	}
	if removed {
		e.compactActive()
	}
	if len(queued) > 0 {
		e.cancelQueued(queued, now)
	}
}

// cancelQueued takes cancelled requests out of the waiting queue (beyond
// the cap H, routed to no rank yet): every rank holds the same queue and
// removes the same ones; rank 0 answers them "cancelled", as it answers the
// arrivals it rejects before routing. Without it a client that gave up on a
// queued request left it to run to its end once routed.
func (e *Executor) cancelQueued(ids map[uint64]bool, now int64) {
	e.cancelledBuf = e.waiting.Remove(func(a *Arrival) bool { return ids[a.ID] }, e.cancelledBuf[:0])
	e.waiting.Trim()
	e.queueCancels += len(e.cancelledBuf)
	if e.cfg.Rank == 0 {
		for _, a := range e.cancelledBuf {
			e.pending = append(e.pending, Response{ID: a.ID, Rank: NoRank, ArrivalUnixNS: a.ArrivalUnixNS,
				FinishUnixNS: max(now, a.ArrivalUnixNS), Error: CancelledError})
		}
	}
	clear(e.cancelledBuf)
	if cap(e.cancelledBuf) > maxKeptSlots {
		e.cancelledBuf = nil
	}
}

// encodeIDs and decodeIDs carry cancelled ids in the arrival broadcast.
func encodeIDs(ids []uint64) []byte {
	b := make([]byte, 0, 8*len(ids))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint64(b, id)
	}
	return b
}

func decodeIDs(b []byte, want int) ([]uint64, error) {
	if len(b) != 8*want {
		return nil, fmt.Errorf("collective desync: %d bytes of cancellations, want %d ids", len(b), want)
	}
	ids := make([]uint64, want)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return ids, nil
}
