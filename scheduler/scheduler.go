package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Fatal errors of Schedule. They are wrapped with the request or the pass
// details; match them with errors.Is.
var (
	// ErrStalled: the stall detector reached 1 000 consecutive stalled passes (§15).
	ErrStalled = errors.New("scheduler stalled for 1000 consecutive passes")
	// ErrReservationViolated: under GUARANTEED_NO_EVICT a continuation chunk
	// or a generation step failed to draw from its reservation (§14.2).
	ErrReservationViolated = errors.New("GUARANTEED_NO_EVICT reservation violated")
	// ErrHelixNoRecompute: a Helix allocation failed while recompute pause is
	// disabled (§13).
	ErrHelixNoRecompute = errors.New("KV allocation failed under Helix and recompute pause is disabled")
)

// outcome is the result of trying to schedule one request (spec §5).
type outcome uint8

const (
	skipped   outcome = iota // not scheduled; the walk continues
	scheduled                // in the batch; budgets committed by the caller
	stopped                  // not scheduled; the current phase ends
	aborted                  // a fatal error was recorded in s.fatal; the pass ends
)

// Per-index flags of the current pass, one byte per active-list index.
const (
	flagVictim       uint8 = 1 << iota // recompute-paused by the generation ladder (§11.2 "victim")
	flagPreempted                      // freed by context preemption (§12 "preempted")
	flagScheduled                      // in Context or Generation this pass (protected, §12)
	flagPaused                         // in Paused this pass
	flagDemoted                        // classified DEMOTED (§10.2)
	flagLetThrough                     // classified LET_THROUGH (§10.2)
	flagContinuation                   // a pending CONTEXT_IN_PROGRESS request (phase 2)
)

// Scheduler is one rank's scheduler. It keeps only what must survive between
// passes (the stall counter, the demotion counters, the published cost model)
// plus scratch buffers reused by every pass, so a pass allocates nothing in
// steady state. Not safe for concurrent use; one executor goroutine owns it.
type Scheduler struct {
	cfg Config
	st  settings
	kv  KVManager

	out Output // returned by Schedule, reused

	// Pass state (§4). Valid during Schedule only.
	list       []*Request
	end        int  // ordinary frontier of phase 1
	frontier   int  // recompute frontier
	host       bool // suspension frees device pages (never under Helix)
	tokensUsed int
	reqsUsed   int
	costUsed   int64
	committed  bool  // a context chunk has been committed (equal-cost floor)
	admitted   bool  // the current context request reached PrepareContext
	genVisited bool  // phase 1 visited a generation request in the window
	fatal      error // first fatal error of the pass

	flags   []uint8 // per list index, see flag*
	pending []int32 // context requests of phase 2, in list order
	// continuations counts pending's CONTEXT_IN_PROGRESS requests.
	continuations int
	order         []int32  // phase-2 visiting order (demotion)
	exec          []uint64 // executing ids, sorted
	lastChunk     []bool   // per Context entry: a last chunk (§16)
	pausedIdx     []int32  // list index of each Paused entry
	sortReq       []*Request
	sortInt       []int

	prefix    prefixSkip
	victims   victimMemo              // failed context-preemption searches of this pass
	fastSkip  bool                    // firstChunkBlocked may skip in this pass
	chunkOf   func(*Request, int) int // firstChunkTokens, bound once in New
	exhausted bool                    // firstChunksExhausted found no page to give in this pass
	pages     PageCounter             // the watermark's page count (nil when it is off)
	gated     bool                    // a first chunk was refused FCFS in this pass (watermark, GUARANTEED_NO_EVICT)
	running   int                     // requests past their first chunk (-1: not counted yet)
	demote    demotionCounters
	stall     int
}

// New validates cfg and returns a scheduler driving kv. Errors wrap
// ErrConfig and name the offending setting.
func New(cfg Config, kv KVManager) (*Scheduler, error) {
	if kv == nil {
		return nil, fmt.Errorf("%w: nil KV manager", ErrConfig)
	}
	st, err := validate(&cfg)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{cfg: cfg, st: st, kv: kv}
	s.chunkOf = s.firstChunkTokens
	s.prefix.keys = make(map[BlockKey]struct{})
	s.demote.counts = make(map[uint64]demoteEntry)
	if err := s.newWatermark(); err != nil {
		return nil, err
	}
	return s, nil
}

// MaxNumRequests is the effective request budget per pass (max_num_requests).
func (s *Scheduler) MaxNumRequests() int { return s.st.maxRequests }

// MaxNumTokens is the token budget M per pass, or Unlimited.
func (s *Scheduler) MaxNumTokens() int { return s.st.maxTokens }

// ChunkUnitSize is the effective chunk unit u.
func (s *Scheduler) ChunkUnitSize() int { return s.st.unit }

// CostBudget returns B and true when equal-cost chunking is on.
func (s *Scheduler) CostBudget() (int64, bool) { return s.st.cost.budget, s.st.cost.on }

// DemotionOn reports whether long-prefill demotion is on (U > 0 and chunking);
// the conversation-aware router publishes estimates only then.
func (s *Scheduler) DemotionOn() bool { return s.st.demotion }

// StallCount is the stall counter after the last pass.
func (s *Scheduler) StallCount() int { return s.stall }

// DemotionCount returns the aging counter of id and whether an entry exists
// (for tests and the iteration log).
func (s *Scheduler) DemotionCount(id uint64) (int64, bool) {
	e, ok := s.demote.counts[id]
	return e.count, ok
}

// DemotionEntries is the number of live demotion counters.
func (s *Scheduler) DemotionEntries() int { return len(s.demote.counts) }

// PublishCost installs O and D published by the online calibrator (CostAuto
// only, spec §9.7); R stays the configured value. It must be called at the
// same iteration on every rank with the same values. An O or D of 0 turns the
// cap off again.
func (s *Scheduler) PublishCost(o, d int64) error {
	if s.cfg.CostMode != CostAuto {
		return fmt.Errorf("%w: PublishCost needs ctx_cost.mode auto (have %s)", ErrConfig, s.cfg.CostMode)
	}
	if o < 0 || d < 0 {
		return fmt.Errorf("%w: published cost O=%d D=%d must be ≥ 0", ErrConfig, o, d)
	}
	c, err := newCostParams(o, d, s.cfg.EqualCost.PerChunkDepthTokens, &s.cfg, s.st.unit)
	if err != nil {
		return err
	}
	s.st.cost = c
	return nil
}

// Schedule runs one scheduling pass (spec §4) over the rank's active list in
// FCFS order. executing holds the ids of the batch still on the device
// (overlap loop; nil otherwise); those requests are scheduled normally but are
// never victims. It allocates KV through the manager while planning.
//
// The returned Output is owned by s and valid until the next call. The error
// is non-nil only for the spec's fatal errors (ErrStalled,
// ErrReservationViolated, ErrHelixNoRecompute); the output is then nil.
func (s *Scheduler) Schedule(active []*Request, executing []uint64) (*Output, error) {
	s.begin(active, executing)
	s.phase1()
	if s.fatal == nil {
		s.phase2()
	}
	if s.fatal != nil {
		err := s.fatal
		s.end2()
		return nil, err
	}
	s.demote.update(s)
	if err := s.detectStall(); err != nil {
		s.end2()
		return nil, err
	}
	s.sortContexts()
	s.out.NumFitting = len(s.out.Context) + len(s.out.Generation)
	s.out.StallCount = s.stall
	s.out.CostUsed = s.costUsed
	if s.st.cost.on {
		s.out.CostBudget = s.st.cost.budget
	}
	s.end2()
	return &s.out, nil
}

// begin resets the pass state and the output record (phase 0, §4.1).
func (s *Scheduler) begin(active []*Request, executing []uint64) {
	s.list = active
	s.end, s.frontier = len(active), len(active)
	s.host = !s.cfg.Helix && s.kv.HasHostTier()
	s.tokensUsed, s.reqsUsed, s.costUsed = 0, 0, 0
	s.committed, s.genVisited, s.fatal = false, false, nil
	s.victims = victimMemo{on: !s.host}
	// The O(1) skip of blocked first chunks (firstChunkBlocked) covers the
	// chunked MAX_UTILIZATION path without a host tier (no suspension for a
	// context) where a context preemption may take any victim (not Helix,
	// not demotion: behindOnly); elsewhere every first chunk is tried.
	s.exhausted = false
	s.gated, s.running = false, -1
	s.fastSkip = s.st.chunked && s.cfg.Policy == MaxUtilization && !s.behindOnly() && !s.kv.HasHostTier()

	if cap(s.flags) < len(active) {
		s.flags = make([]uint8, len(active), len(active)+len(active)/4)
	}
	s.flags = s.flags[:len(active)]
	clear(s.flags)
	s.pending = s.pending[:0]
	s.continuations = 0
	s.order = s.order[:0]
	s.lastChunk = s.lastChunk[:0]
	s.pausedIdx = s.pausedIdx[:0]

	// Executing ids are looked up only when a victim is considered, by binary search.
	s.exec = append(s.exec[:0], executing...)
	if !slices.IsSorted(s.exec) {
		slices.Sort(s.exec)
	}

	o := &s.out
	o.Context, o.Generation = o.Context[:0], o.Generation[:0]
	o.Paused, o.RecomputePaused, o.SatOut = o.Paused[:0], o.RecomputePaused[:0], o.SatOut[:0]
	o.Deferred, o.Demoted, o.Charged, o.Notes = o.Deferred[:0], o.Demoted[:0], o.Charged[:0], o.Notes[:0]
	o.NumFitting, o.StallCount, o.CostUsed, o.CostBudget = 0, 0, 0, 0
}

// end2 drops the references of the pass so that finished requests can be collected.
func (s *Scheduler) end2() { s.list = nil }

// --- budgets (§6) ---

// canFit reports whether n more tokens fit the token budget.
func (s *Scheduler) canFit(n int) bool {
	return s.st.maxTokens == Unlimited || s.tokensUsed+n <= s.st.maxTokens
}

// tokensLeft is M − used, or MaxInt when M is unlimited.
func (s *Scheduler) tokensLeft() int {
	if s.st.maxTokens == Unlimited {
		return math.MaxInt
	}
	return s.st.maxTokens - s.tokensUsed
}

// requestsFull reports whether the request budget is used up.
func (s *Scheduler) requestsFull() bool { return s.reqsUsed >= s.st.maxRequests }

// isExecuting reports whether id belongs to the batch still executing.
func (s *Scheduler) isExecuting(id uint64) bool {
	_, ok := slices.BinarySearch(s.exec, id)
	return ok
}

// --- phase 1: the generation walk (§4.2) ---

// phase1 walks the list with the ordinary frontier end (which the suspend
// rung shrinks) and collects context requests into pending.
func (s *Scheduler) phase1() {
	for i := 0; i < s.end; i++ {
		if s.flags[i]&flagVictim != 0 {
			continue
		}
		if s.requestsFull() {
			break
		}
		r := s.list[i]
		if !r.State.InWindow() {
			continue
		}
		if r.State.IsContext() {
			s.pending = append(s.pending, int32(i))
			if r.State == ContextInProgress {
				s.flags[i] |= flagContinuation
				s.continuations++
			}
			continue
		}
		s.genVisited = true
		switch s.scheduleGeneration(i) {
		case scheduled:
			s.out.Generation = append(s.out.Generation, r)
			s.flags[i] |= flagScheduled
			s.tokensUsed++
			s.reqsUsed++
		case stopped, aborted:
			return
		}
	}
}

// --- phase 2: pending contexts (§4.3) ---

// phase2 visits the pending contexts in demotion order.
func (s *Scheduler) phase2() {
	order := s.demote.classify(s)
	s.prefix.begin(s)
	contLeft := s.continuations // continuations not yet visited (order holds them all)
	for _, idx := range order {
		if s.requestsFull() {
			break
		}
		if s.st.chunked && s.tokensLeft() < s.st.unit {
			// The SKIP every request left would reach, with no KV call: the
			// token budget only shrinks within a pass (issue 24: the walk
			// stops when nothing further can be admitted).
			break
		}
		cont := s.flags[idx]&flagContinuation != 0
		if cont {
			contLeft--
		}
		if s.flags[idx]&(flagPreempted|flagPaused) != 0 {
			continue // freed or suspended for an earlier context this pass
		}
		if !cont && (s.gated || s.firstChunksExhausted()) {
			// The watermark or GUARANTEED_NO_EVICT's reservation refused an
			// earlier first chunk (FCFS), or no first chunk can get a page:
			// the SKIP every first chunk left would reach, without reading
			// it. Once only first chunks are left the walk stops.
			if contLeft == 0 {
				break
			}
			continue
		}
		r := s.list[idx]
		// A blocked first chunk is skipped in O(1), the SKIP scheduleContext
		// would reach; before the prefix probe while no key is registered
		// (nothing can be deferred then), after it otherwise.
		if len(s.prefix.keys) == 0 && s.firstChunkBlocked(int(idx)) {
			continue
		}
		key, hasKey := s.prefix.probe(s, r)
		if hasKey && s.prefix.registered(key) {
			s.out.Deferred = append(s.out.Deferred, r.ID)
			continue
		}
		if len(s.prefix.keys) > 0 && s.firstChunkBlocked(int(idx)) {
			continue
		}
		charged, last, oc := s.scheduleContext(int(idx))
		switch oc {
		case stopped, aborted:
			return
		case skipped:
			continue
		}
		s.commitContext(int(idx), charged, last)
		s.prefix.register(s, r, key, hasKey)
	}
}

// firstChunkBlocked reports that scheduling the first chunk at idx is
// certain to end SKIPPED without a trace, so phase 2 may skip it in O(1)
// (issue 24: with thousands of first chunks waiting on a full pool, each
// one was admitted, matched, refused its pages, searched for a victim and
// released, every pass). It holds when the fast skip is on for this pass
// (fastSkip), the KV manager promises the allocation fails
// (KVManager.FirstChunkBlocked), and no victim could be freed for it: no
// recompute pause, or an earlier search of this pass found none and the
// only request it left open does not qualify. The outcome, the output and
// the KV state are those of the full attempt.
func (s *Scheduler) firstChunkBlocked(idx int) bool {
	r := s.list[idx]
	if !s.fastSkip || r.State != ContextInit {
		return false
	}
	if s.cfg.RecomputePause && !s.victims.exhausted(s, idx) {
		return false
	}
	return s.kv.FirstChunkBlocked(r, s.chunkOf)
}

// firstChunksExhausted reports that every first chunk left in this pass is
// certain to end SKIPPED without a trace, so the waiting walk need not read
// them (issue 24: the walk stops when nothing further can be admitted;
// continuations are still visited, as one may fit in the room of its last
// page). It holds when the fast skip is on, no victim can be freed (as in
// firstChunkBlocked) and the KV manager has no page to give at all
// (KVManager.NoFirstChunkFits). Once true it stays true for the pass: pages
// are only taken from here on (a freed victim ends the pass) and the
// victims' set only shrinks.
//
// Deliberate difference from spec §8: a first chunk behind this point is
// not probed, so one whose first new block was registered earlier in the
// pass is not listed in Output.Deferred (the spec defers it before it
// would be skipped). Deferral and this skip have the same effect (the
// request waits, nothing changes); only the list, which feeds the
// iteration log's num_deferred and no plan digest, is shorter. Probing
// every waiting request kept the pass O(waiting) on a full pool
// (docs/scheduling.md).
func (s *Scheduler) firstChunksExhausted() bool {
	if !s.fastSkip {
		return false
	}
	if s.exhausted {
		return true
	}
	if s.cfg.RecomputePause && !s.victims.exhausted(s, -1) {
		return false
	}
	s.exhausted = s.kv.NoFirstChunkFits()
	return s.exhausted
}

// firstChunkTokens is the chunk that chunked would size for the first chunk
// of r once a reusable prefix of matched tokens is claimed (0: it would
// skip). It reads the budgets of the pass as they stand.
func (s *Scheduler) firstChunkTokens(r *Request, matched int) int {
	pre := r.Remaining()
	post := pre - matched
	chunk := s.sizeChunk(pre, post, int64(r.ContextPosition+matched))
	if chunk <= 0 {
		return 0
	}
	return min(chunk, post)
}

// sizeChunk is chunked's rule for the size of a request's next chunk (§7.2),
// charged before the clip to post: pre and post are the tokens left before
// and after the reusable prefix is claimed, pos the KV depth the chunk
// starts at. 0 or less: the chunk is skipped.
func (s *Scheduler) sizeChunk(pre, post int, pos int64) int {
	rt := pre
	if s.cfg.PrefixAware {
		rt = post
	}
	chunk := min(s.tokensLeft(), rt)
	if s.st.maxTokens != Unlimited {
		chunk = min(chunk, s.st.maxTokens)
	}
	if s.st.cost.on {
		chunk = s.costCap(chunk, pos)
	}
	if chunk < rt { // not the last chunk: round down to the unit
		chunk = chunk / s.st.unit * s.st.unit
	}
	return chunk
}

// commitContext books a SCHEDULED context chunk: tokens, one request slot and
// its cost (§9.5).
func (s *Scheduler) commitContext(idx, charged int, last bool) {
	r := s.list[idx]
	s.out.Context = append(s.out.Context, r)
	s.out.Charged = append(s.out.Charged, charged)
	s.lastChunk = append(s.lastChunk, last)
	s.flags[idx] |= flagScheduled
	s.tokensUsed += charged
	s.reqsUsed++
	if s.st.chunked && s.st.cost.on {
		c := &s.st.cost
		p := int64(r.ContextPosition)
		s.costUsed += (c.o+p)*int64(charged) + c.r*p
		s.committed = true
	}
}

// --- after phase 2 ---

// sortContexts applies §16: when any scheduled context is not a last chunk,
// a stable partition puts non-last chunks first; otherwise scheduling order
// stays. Charged is permuted alongside.
func (s *Scheduler) sortContexts() {
	ctx := s.out.Context
	anyChunking := false
	for _, last := range s.lastChunk {
		if !last {
			anyChunking = true
			break
		}
	}
	if !anyChunking {
		return
	}
	s.sortReq = append(s.sortReq[:0], ctx...)
	s.sortInt = append(s.sortInt[:0], s.out.Charged...)
	k := 0
	for pass := 0; pass < 2; pass++ {
		wantLast := pass == 1
		for j, r := range s.sortReq {
			if s.lastChunk[j] == wantLast {
				ctx[k] = r
				s.out.Charged[k] = s.sortInt[j]
				k++
			}
		}
	}
	clear(s.sortReq) // drop references
}

// note records a log line for the caller.
func (s *Scheduler) note(level Level, format string, args ...any) {
	s.out.Notes = append(s.out.Notes, Note{Level: level, Text: fmt.Sprintf(format, args...)})
}
