package executor

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// iterSource releases requests by iteration: arrivals[k] are due at rank 0's
// k-th call. It makes multi-iteration scenarios independent of the clock.
type iterSource struct {
	reqs     []workload.Request
	arrivals map[int][]int // iteration → request indices
	calls    int
	left     int
}

func newIterSource(reqs []workload.Request, arrivals map[int][]int) *iterSource {
	n := 0
	for _, v := range arrivals {
		n += len(v)
	}
	return &iterSource{reqs: reqs, arrivals: arrivals, left: n}
}

func (s *iterSource) Due(time.Time) []Arrival {
	var out []Arrival
	for _, i := range s.arrivals[s.calls] {
		r := s.reqs[i]
		out = append(out, Arrival{ID: uint64(r.Index), MaxNewTokens: r.MaxNewTokens, Prompt: r.Tokens()})
		s.left--
	}
	s.calls++
	return out
}
func (s *iterSource) Exhausted() bool        { return s.left == 0 }
func (s *iterSource) NextArrival() time.Time { return time.Time{} }
func (s *iterSource) Total() int             { return len(s.reqs) }

// skipPlanner makes a rank's local batch empty at chosen passes (as when its
// pool is exhausted), while its requests stay active: the fleet then skips
// the forward and ranks disagree on can_queue_this_rank.
type skipPlanner struct {
	Planner
	skip  map[int]bool
	pass  int
	empty scheduler.Output
}

func (p *skipPlanner) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	k := p.pass
	p.pass++
	if p.skip[k] {
		return &p.empty, nil
	}
	return p.Planner.Schedule(active, executing)
}

// TestFlushSymmetryRandomSkips covers S-1…S-7 and S-9 dynamically: attention
// DP with events on, random local empty batches on random ranks (so ranks
// disagree on can_queue_this_rank and on previousBatch), both loops. Every
// rank's collective trace is identical element by element, the overlap loop
// flushes exactly once per iteration on every rank (R2, R3), the
// non-overlap loop once per forward (R6), every event reaches the stream
// with per-rank sequence numbers without gaps (R7), and outputs are
// unchanged.
func TestFlushSymmetryRandomSkips(t *testing.T) {
	reqs := longOutputRequests(12, 24, 6)
	ref := &fleet{ranks: 1, reqs: reqs}
	ref.run(t)
	ref.requireNoErrors(t)
	want := ref.digest(t)
	for seed := int64(1); seed <= 12; seed++ {
		rng := rand.New(rand.NewSource(seed))
		ranks := 2 + rng.Intn(2)
		overlap := seed%2 == 0
		skips := make([]map[int]bool, ranks)
		for r := range skips {
			skips[r] = map[int]bool{}
			for k := 0; k < 40; k++ {
				if rng.Intn(4) == 0 {
					skips[r][k] = true
				}
			}
		}
		f := &fleet{ranks: ranks, reqs: reqs, overlap: overlap, events: 64,
			wrap: func(rank int, p Planner) Planner { return &skipPlanner{Planner: p, skip: skips[rank]} }}
		f.run(t)
		f.requireNoErrors(t)
		f.requireEqualTraces(t)
		require.Equal(t, want, f.digest(t), "seed %d", seed)
		for r, ex := range f.execs {
			if overlap {
				require.EqualValues(t, f.results[r].Iterations, ex.flushes, "seed %d rank %d: one flush per iteration", seed, r)
			} else {
				require.EqualValues(t, f.results[r].ForwardIterations, ex.flushes, "seed %d rank %d: one flush per forward", seed, r)
			}
		}
		checkEventStream(t, f, fmt.Sprintf("seed %d", seed))
	}
}

// checkEventStream: per rank, sequence numbers start at 0 without gaps and
// stored − removed blocks equals the blocks left in the rank's tree.
func checkEventStream(t *testing.T, f *fleet, label string) {
	t.Helper()
	next := map[int]uint64{}
	live := map[int]int{}
	for _, line := range f.eventLog.lines {
		for _, l := range splitLines(line) {
			var ev struct {
				Rank   int
				Seq    uint64
				Type   string
				Blocks []json.RawMessage
				Hashes []json.RawMessage
			}
			require.NoError(t, json.Unmarshal(l, &ev), label)
			require.Equal(t, next[ev.Rank], ev.Seq, "%s: rank %d sequence", label, ev.Rank)
			next[ev.Rank]++
			live[ev.Rank] += len(ev.Blocks) - len(ev.Hashes)
		}
	}
	for r, kv := range f.kvs {
		require.Positive(t, next[r], "%s: rank %d published nothing", label, r)
		require.Equal(t, kv.ReusableBlocks(), live[r], "%s: rank %d stored − removed", label, r)
	}
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		if i > 0 {
			out = append(out, b[:i])
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}

// S-8: events disabled → no event allgather in either loop.
func TestFlushEventsOffNoCollective(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		f := &fleet{ranks: 2, reqs: longOutputRequests(4, 16, 3), overlap: overlap}
		f.run(t)
		f.requireNoErrors(t)
		f.requireEqualTraces(t)
		for _, c := range f.comms {
			for _, e := range c.Trace() {
				require.NotEqual(t, "kv_events", e.Name)
			}
		}
		for _, ex := range f.execs {
			require.Zero(t, ex.flushes)
		}
	}
}

// S-11 / S-12: overlap loop, no attention DP, one rank, batch sizes
// [1, 1, 0, 1]: flushes per iteration [0, 1, 1, 0] (only when a previous
// batch was processed); none with events disabled.
func TestFlushCadenceWithoutAttentionDP(t *testing.T) {
	reqs := longOutputRequests(3, 8, 1) // one token each: done with its context chunk
	for _, events := range []int{8, 0} {
		f := &fleet{ranks: 1, reqs: reqs, overlap: true, events: events,
			source: newIterSource(reqs, map[int][]int{0: {0}, 1: {1}, 3: {2}})}
		var perIter []int
		f.wrap = func(rank int, p Planner) Planner {
			return plannerFunc(func(a []*scheduler.Request, x []uint64) (*scheduler.Output, error) {
				if ex := f.execs[0]; ex != nil {
					perIter = append(perIter, ex.flushes)
				}
				return p.Schedule(a, x)
			})
		}
		f.run(t)
		f.requireNoErrors(t)
		perIter = append(perIter, f.execs[0].flushes)
		// perIter[k] = flushes before iteration k's schedule.
		var got []int
		for k := 1; k < len(perIter) && k <= 4; k++ {
			got = append(got, perIter[k]-perIter[k-1])
		}
		if events > 0 {
			require.Equal(t, []int{0, 1, 1, 0}, got)
		} else {
			require.Equal(t, []int{0, 0, 0, 0}, got)
		}
	}
}

type plannerFunc func(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error)

func (f plannerFunc) Schedule(a []*scheduler.Request, x []uint64) (*scheduler.Output, error) {
	return f(a, x)
}

// eventsKV is a KV stub for the flush helper alone: it hands out n events.
type eventsKV struct {
	KV
	n  int
	id uint64
}

func (k *eventsKV) EventsEnabled() bool { return true }
func (k *eventsKV) FlushIterationEvents() []kvpool.Event {
	var evs []kvpool.Event
	for i := 0; i < k.n; i++ {
		evs = append(evs, kvpool.Event{ID: k.id, Kind: kvpool.EventRemoved})
		k.id++
	}
	k.n = 0
	return evs
}

// S-10: rank 0 holds 10 pending events, rank 1 holds 3, 8 per flush: rank 0
// publishes its last 8 then rank 1's 3 (11 entries, rank order); 2 dropped.
func TestFlushContentRankOrder(t *testing.T) {
	comms := nccl.NewLocalGroup(2, nccl.LocalOptions{Timeout: 5 * time.Second})
	sink := &recordingWriter{}
	done := make(chan error, 2)
	execs := make([]*Executor, 2)
	for r := 0; r < 2; r++ {
		execs[r] = &Executor{cfg: Config{Rank: r, Ranks: 2, Events: true, EventBufferMaxSize: 8, EventSink: sink,
			Clock: time.Now}, d: Deps{Comm: comms[r], KV: &eventsKV{n: []int{10, 3}[r]}}}
	}
	for r := 0; r < 2; r++ {
		go func(r int) { done <- execs[r].addKVCacheEventsSynced(false) }(r)
	}
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	var got []string
	for _, w := range sink.lines {
		for _, l := range splitLines(w) {
			var ev struct{ Rank, Seq int }
			require.NoError(t, json.Unmarshal(l, &ev))
			got = append(got, fmt.Sprintf("%d:%d", ev.Rank, ev.Seq))
		}
	}
	require.Equal(t, []string{"0:2", "0:3", "0:4", "0:5", "0:6", "0:7", "0:8", "0:9", "1:0", "1:1", "1:2"}, got)
	require.EqualValues(t, 2, execs[0].res.EventsDropped)
}
