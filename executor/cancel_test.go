package executor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// cancellingSource replays a trace and withdraws some requests once they
// have been handed out for `after` calls of Due (mid-prefill or mid-decode).
type cancellingSource struct {
	*TraceSource
	calls  int
	after  int
	cancel map[uint64]bool
	out    map[uint64]int // id → the Due call that handed it out
	done   map[uint64]bool
}

func (s *cancellingSource) Due(now time.Time) []Arrival {
	s.calls++
	items := s.TraceSource.Due(now)
	for _, a := range items {
		s.out[a.ID] = s.calls
	}
	return items
}

func (s *cancellingSource) Cancelled() []uint64 {
	var ids []uint64
	for id := range s.cancel {
		if at, ok := s.out[id]; ok && !s.done[id] && s.calls >= at+s.after {
			ids = append(ids, id)
			s.done[id] = true
		}
	}
	return ids
}

// TestCancelledRequestsLeaveNothingBehind: requests withdrawn at different
// points (waiting, mid-prefill, mid-decode, inside a launched step of the
// overlap loop) end with a "cancelled" answer on every rank count, free all
// their pages on every rank, and leave the other requests' tokens as they
// are without cancellations.
func TestCancelledRequestsLeaveNothingBehind(t *testing.T) {
	for _, ranks := range []int{1, 4} {
		for _, overlap := range []bool{false, true} {
			for _, after := range []int{1, 2, 4, 8} {
				t.Run(fmt.Sprintf("ranks=%d/overlap=%v/after=%d", ranks, overlap, after), func(t *testing.T) {
					reqs := sampleRequests(t, 32, 0.02)
					for i := range reqs {
						reqs[i].MaxNewTokens = 24
					}
					base := &fleet{ranks: ranks, overlap: overlap, pages: 40, reqs: reqs}
					base.run(t)
					base.requireNoErrors(t)
					want := map[uint64][]int32{}
					for _, r := range base.results[0].Responses {
						want[r.ID] = r.Output
					}

					cancel := map[uint64]bool{}
					for i := 1; i < len(reqs); i += 3 {
						cancel[uint64(reqs[i].Index)] = true
					}
					src := &cancellingSource{TraceSource: NewTraceSource(reqs, time.Now()), after: after, cancel: cancel,
						out: map[uint64]int{}, done: map[uint64]bool{}}
					f := &fleet{ranks: ranks, overlap: overlap, pages: 40, reqs: reqs, source: src}
					f.run(t)
					f.requireNoErrors(t)
					seen := map[uint64]bool{}
					cancelled := 0
					for _, r := range f.results[0].Responses {
						require.False(t, seen[r.ID], "request %d answered twice", r.ID)
						seen[r.ID] = true
						if r.Error == CancelledError {
							require.True(t, cancel[r.ID], "request %d was not cancelled", r.ID)
							cancelled++
							continue
						}
						require.Empty(t, r.Error)
						require.Equal(t, want[r.ID], r.Output, "request %d", r.ID)
					}
					require.Len(t, seen, len(reqs), "every request is answered")
					if after <= 2 {
						require.Positive(t, cancelled, "early cancellations take effect")
					}
					for i, kv := range f.kvs {
						require.Equal(t, 40, kv.FreePages(), "rank %d left pages behind", i)
					}
				})
			}
		}
	}
}
