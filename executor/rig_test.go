package executor

// The shared test rig of the E-suite, P-suite, rank-state and property tests:
// an in-process group of executors whose communicator, KV manager, planner and
// engine are wrapped by recorders, so a test can observe every collective,
// every KV call of interest and every scheduler pass on every rank, iteration
// by iteration.

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// ---------------------------------------------------------------------------
// Test rig
// ---------------------------------------------------------------------------

// scriptSource hands rank 0 its arrivals by iteration: call k of Due (one
// call per iteration) returns byIter[k]. It is exhausted once every slot was
// handed out, so the shutdown flag travels in the broadcast of iteration
// len(byIter)−1. It never makes rank 0 sleep.
type scriptSource struct {
	byIter [][]Arrival
	calls  int
}

func (s *scriptSource) Due(time.Time) []Arrival {
	var out []Arrival
	if s.calls < len(s.byIter) {
		out = s.byIter[s.calls]
	}
	s.calls++
	return out
}
func (s *scriptSource) Exhausted() bool { return s.calls >= len(s.byIter) }
func (s *scriptSource) NextArrival() time.Time {
	if s.Exhausted() {
		return time.Time{}
	}
	return time.Now()
}
func (s *scriptSource) Total() int {
	n := 0
	for _, a := range s.byIter {
		n += len(a)
	}
	return n
}

// allAtOnce is a script whose arrivals all come in iteration 0.
func allAtOnce(items ...Arrival) *scriptSource { return &scriptSource{byIter: [][]Arrival{items}} }

// arrival builds a request with a deterministic prompt of n tokens (< 512).
func arrival(id uint64, n, maxNew int) Arrival {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((int(id)*131 + i*7 + 3) % 509)
	}
	return Arrival{ID: id, Prompt: p, MaxNewTokens: maxNew}
}

// passRec is one scheduler pass as a rank saw it.
type passRec struct {
	active, executing                    []uint64
	ctx, gen, recomputed, satOut, paused []uint64
	numFitting, stall                    int
	freeAfter                            int            // free GPU pages right after Schedule
	caps                                 map[uint64]int // ledger capacity of every scheduled request after Schedule
	realScheduled                        int            // scheduled requests that are not dummies
}

// recPlanner records every pass and the rows of the batch it implies
// (context then generation, the order of prepareBatch).
type recPlanner struct {
	inner  Planner
	kv     KV
	passes []passRec
	rows   []row
	// mutate, when set, may alter the output before the executor sees it
	// (fault injection, P-21); pass is 0-based.
	mutate func(pass int, out *scheduler.Output)
	// after runs right after Schedule returned (operation-order tests).
	after func(out *scheduler.Output)
}

type row struct {
	id  uint64
	ctx bool
}

func idsOf(rs []*scheduler.Request) []uint64 {
	out := []uint64{}
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func (p *recPlanner) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	out, err := p.inner.Schedule(active, executing)
	if err != nil {
		return nil, err
	}
	if p.mutate != nil {
		p.mutate(len(p.passes), out)
	}
	rec := passRec{active: idsOf(active), executing: slices.Clone(executing), ctx: idsOf(out.Context),
		gen: idsOf(out.Generation), recomputed: idsOf(out.RecomputePaused), satOut: idsOf(out.SatOut),
		paused: idsOf(out.Paused), numFitting: out.NumFitting, stall: out.StallCount,
		freeAfter: p.kv.FreePages(), caps: map[uint64]int{}}
	p.rows = p.rows[:0]
	for _, r := range out.Context {
		p.rows = append(p.rows, row{r.ID, true})
	}
	for _, r := range out.Generation {
		p.rows = append(p.rows, row{r.ID, false})
	}
	for _, r := range p.rows {
		rec.caps[r.id] = p.kv.Capacity(r.id)
		if r.id < dummyIDBase {
			rec.realScheduled++
		}
	}
	p.passes = append(p.passes, rec)
	if p.after != nil {
		p.after(out)
	}
	return out, nil
}

// freeRec is one Free call: ledger capacity and free pages around it.
type freeRec struct {
	id                       uint64
	capBefore, before, after int
}

// recKV wraps a rank's KV manager (the scheduler and the executor both call
// through it), recording frees and reverts, counting AddDummy calls, failing
// the next failAddDummy of them, and reporting selected calls to hook.
type recKV struct {
	KV
	frees        []freeRec
	reverts      []uint64
	addDummies   int
	failAddDummy int
	hook         func(op string, id uint64)
}

func (k *recKV) Free(r *scheduler.Request) {
	f := freeRec{id: r.ID, capBefore: k.KV.Capacity(r.ID), before: k.KV.FreePages()}
	k.KV.Free(r)
	f.after = k.KV.FreePages()
	k.frees = append(k.frees, f)
	k.note("free", r.ID)
}

func (k *recKV) RevertAllocateGeneration(r *scheduler.Request) {
	k.reverts = append(k.reverts, r.ID)
	k.KV.RevertAllocateGeneration(r)
}

func (k *recKV) AddDummy(r *scheduler.Request, tokens int) bool {
	k.addDummies++
	if k.failAddDummy > 0 {
		k.failAddDummy--
		return false
	}
	return k.KV.AddDummy(r, tokens)
}

func (k *recKV) HasCache(id uint64) bool { k.note("has_cache", id); return k.KV.HasCache(id) }
func (k *recKV) IsActive(id uint64) bool { k.note("is_active", id); return k.KV.IsActive(id) }

func (k *recKV) note(op string, id uint64) {
	if k.hook != nil {
		k.hook(op, id)
	}
}

// hookComm wraps a rank's communicator: send may replace the payload of an
// allgather (fault injection), recv observes its result, reorder may permute
// it, and onEnter sees every collective name as the rank enters it.
type hookComm struct {
	*nccl.LocalComm
	send    func(name string, data []byte) []byte
	recv    func(name string, all [][]byte)
	reorder func(name string, all [][]byte) [][]byte
	onEnter func(name string)
}

func (c *hookComm) AllGather(name string, data []byte) ([][]byte, error) {
	if c.onEnter != nil {
		c.onEnter(name)
	}
	if c.send != nil {
		data = c.send(name, data)
	}
	all, err := c.LocalComm.AllGather(name, data)
	if err != nil {
		return nil, err
	}
	if c.recv != nil {
		c.recv(name, all)
	}
	if c.reorder != nil {
		all = c.reorder(name, all)
	}
	return all, nil
}

func (c *hookComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	if c.onEnter != nil {
		c.onEnter(name)
	}
	return c.LocalComm.Broadcast(name, root, data)
}

// iterSnap is a rank's state right after one of its iterations.
type iterSnap struct {
	iter     int64
	traceLen int
	shutdown bool
	active   int
}

// rig is an in-process group of n executors. Zero fields take defaults.
type rig struct {
	n       int
	helix   bool // one aggregated-Helix CP group of n ranks (else attention DP when n > 1)
	overlap bool
	check   bool // Helix schedule check
	pages   int  // pages per rank (default 256)
	ppt     int  // tokens per page (default 8)
	sc      scheduler.Config
	src     Source
	// seqEngine uses the content-checking test engine instead of the fake
	// one (required under Helix, where the fake engine refuses to start).
	seqEngine bool
	wrapEng   func(rank int, e bridge.Engine) bridge.Engine
	kvcfg     func(rank int, c *kvpool.Config)
	// after runs on the rank's goroutine after each of its iterations.
	after func(rr *rigRank)
	// virtual runs the ranks on a virtual clock from this epoch (the
	// engine must model its cost: wrap it with wrapEng).
	virtual *time.Time
	// measuredHost: Config.MeasuredHostTime (with virtual).
	measuredHost bool
	// locked: the ranks' goroutines are locked to their threads
	// (Config.ThreadLocked; also with measuredHost).
	locked bool
	// maxSeqLen is the KV pool's and the executor's max_seq_len (0: unset).
	maxSeqLen int
	ranks     []*rigRank
}

type rigRank struct {
	rank  int
	comm  *nccl.LocalComm
	hc    *hookComm
	pool  *kvpool.Manager
	kv    *recKV
	plan  *recPlanner
	eng   bridge.Engine
	seq   *seqEngine // when rig.seqEngine
	ex    *Executor
	log   *recordingWriter
	notes []scheduler.Note
	snaps []iterSnap
	res   *Result
	err   error
}

// build creates every rank; tweak ranks' wrappers before drive.
func (g *rig) build(t testing.TB) *rig {
	t.Helper()
	if g.n == 0 {
		g.n = 1
	}
	if g.pages == 0 {
		g.pages = 256
	}
	if g.ppt == 0 {
		g.ppt = 8
	}
	if g.sc.MaxBatchSize == 0 {
		g.sc = defaultSched()
	}
	cp := 1
	if g.helix {
		cp = g.n
		g.sc.Helix = true
		g.sc.PrefixAware = false
		g.seqEngine = true
	}
	g.sc.LedgerBlockTokens = g.ppt * cp
	comms := nccl.NewLocalGroup(g.n, nccl.LocalOptions{Timeout: 20 * time.Second})
	g.ranks = make([]*rigRank, g.n)
	for i := range g.ranks {
		rr := &rigRank{rank: i, comm: comms[i], log: &recordingWriter{}}
		rr.hc = &hookComm{LocalComm: comms[i]}
		kc := kvpool.Config{NumPages: g.pages, TokensPerPage: g.ppt, MaxSeqLen: g.maxSeqLen}
		if g.helix {
			kc.CP, kc.CPRank = cp, i
		}
		if g.kvcfg != nil {
			g.kvcfg(i, &kc)
		}
		var err error
		rr.pool, err = kvpool.New(kc)
		require.NoError(t, err)
		rr.kv = &recKV{KV: rr.pool}
		sch, err := scheduler.New(g.sc, rr.kv)
		require.NoError(t, err)
		rr.plan = &recPlanner{inner: sch, kv: rr.kv}
		if g.seqEngine {
			rr.seq = newSeqEngine(i, cp, g.ppt, rr.plan)
			rr.eng = rr.seq
		} else {
			rr.eng, err = fake.New(bridge.Config{Preset: "tiny", NumPages: g.pages, NumHostPages: kc.HostPages, TokensPerPage: g.ppt, Seed: 1})
			require.NoError(t, err)
		}
		if g.wrapEng != nil {
			rr.eng = g.wrapEng(i, rr.eng)
		}
		d := Deps{Comm: rr.hc, Engine: rr.eng, KV: rr.kv, Planner: rr.plan}
		if i == 0 {
			d.Source = g.src
		}
		cfg := Config{Rank: i, Ranks: g.n, Scheduler: g.sc, Helix: g.helix, ScheduleCheck: g.check,
			Overlap: g.overlap, IterLog: rr.log, MaxIdleSleep: time.Millisecond, MaxSeqLen: g.maxSeqLen,
			OnNote: func(_ int, n scheduler.Note) { rr.notes = append(rr.notes, n) }}
		if g.virtual != nil {
			cfg.VirtualClock, cfg.VirtualEpoch = true, *g.virtual
			cfg.MeasuredHostTime = g.measuredHost
		}
		cfg.ThreadLocked = g.locked || g.measuredHost
		rr.ex, err = New(cfg, d)
		require.NoError(t, err)
		g.ranks[i] = rr
	}
	return g
}

// drive runs every rank on its own goroutine, iteration by iteration, like
// Run but snapshotting each rank after every iteration. limit > 0 stops
// every rank after that many more iterations (without draining); otherwise the
// ranks run until the loop exits. A failing rank closes its communicator so
// its peers fail fast.
func (g *rig) drive(limit int) {
	var wg sync.WaitGroup
	for _, rr := range g.ranks {
		wg.Add(1)
		go func(rr *rigRank) {
			defer wg.Done()
			e := rr.ex
			fail := func(err error) {
				rr.err = fmt.Errorf("rank %d iteration %d: %w", rr.rank, e.iter, err)
				rr.comm.Close()
			}
			start := len(rr.snaps)
			for limit <= 0 || len(rr.snaps)-start < limit {
				more, err := e.iteration()
				if err != nil {
					fail(err)
					return
				}
				if !more {
					if err := e.drain(); err != nil {
						fail(err)
						return
					}
					e.res.Iterations = e.iter
					rr.res = &e.res
					return
				}
				rr.snaps = append(rr.snaps, iterSnap{iter: e.iter, traceLen: len(rr.comm.Trace()),
					shutdown: e.shutdown, active: len(e.active)})
				if g.after != nil {
					g.after(rr)
				}
				if len(rr.snaps) > 20000 {
					fail(errors.New("test livelock limit of 20000 iterations"))
					return
				}
			}
		}(rr)
	}
	wg.Wait()
}

// run runs every rank's Run on its own goroutine (the production entry).
func (g *rig) run() {
	var wg sync.WaitGroup
	for _, rr := range g.ranks {
		wg.Add(1)
		go func(rr *rigRank) {
			defer wg.Done()
			if g.locked || g.measuredHost {
				runtime.LockOSThread() // Config.ThreadLocked
				defer runtime.UnlockOSThread()
			}
			if rr.res, rr.err = rr.ex.Run(); rr.err != nil {
				rr.comm.Close()
			}
		}(rr)
	}
	wg.Wait()
}

func (g *rig) requireNoErrors(t testing.TB) {
	t.Helper()
	var errs []error
	for _, rr := range g.ranks {
		errs = append(errs, rr.err)
	}
	require.NoError(t, errors.Join(errs...))
}

// requireEqualTraces: every rank entered the same collectives (§7).
func (g *rig) requireEqualTraces(t testing.TB) {
	t.Helper()
	base := g.ranks[0].comm.Trace()
	for _, rr := range g.ranks[1:] {
		require.Equal(t, base, rr.comm.Trace(), "collective trace of rank %d differs from rank 0", rr.rank)
	}
}

// outputs maps rank 0's responses by id, asserting each id answered once.
func (g *rig) outputs(t testing.TB) map[uint64]Response {
	t.Helper()
	require.NotNil(t, g.ranks[0].res, "rank 0 did not finish")
	out := map[uint64]Response{}
	for _, r := range g.ranks[0].res.Responses {
		_, dup := out[r.ID]
		require.False(t, dup, "request %d answered twice", r.ID)
		out[r.ID] = r
	}
	return out
}

// requireNoLeaks: every page is back and the pool is consistent.
func (g *rig) requireNoLeaks(t testing.TB) {
	t.Helper()
	for _, rr := range g.ranks {
		require.NoError(t, rr.pool.CheckInvariants(), "rank %d", rr.rank)
		require.Equal(t, rr.pool.TotalPages(), rr.pool.FreePages(), "rank %d leaked pages", rr.rank)
	}
}

// seqEngine is a test-only bridge.Engine that works under Helix. It knows
// which request each row belongs to (from the planner's last pass) and
// checks the control plane's bookkeeping on every row:
//
//   - positions are continuous: a context chunk starts where the request's
//     KV ends (or at 0, a new incarnation after a recompute reset), a decode
//     writes exactly the next position;
//   - the block table covers the row (one page per ledger block of P·cp);
//   - every position this CP rank owns reads back, through the block table,
//     the token written there (a wrong or stale page is caught).
//
// It samples a hash of the whole token sequence up to the row's last
// position, so its outputs depend only on content: a recompute that rebuilds
// the same sequence yields the same tokens as an uninterrupted run.
type seqEngine struct {
	rank, cp, P int
	plan        *recPlanner
	slab        map[int32][]int32
	life        map[uint64]*seqLife
	inflight    []bridge.StepResult
	steps       int
}

// seqLife is one request's history on one rank.
type seqLife struct {
	tokens       []int32  // current incarnation: the token at each written position
	hashes       []uint64 // running content hash per position
	prefills     [][2]int // every context chunk [start, end), all incarnations
	decodes      []int    // every decode position over the request's life
	incarnations int
	sampled      []int32
}

func newSeqEngine(rank, cp, P int, plan *recPlanner) *seqEngine {
	return &seqEngine{rank: rank, cp: cp, P: P, plan: plan, slab: map[int32][]int32{}, life: map[uint64]*seqLife{}}
}

func (e *seqEngine) Shape() bridge.ModelShape { return bridge.ModelShape{VocabSize: 512} }
func (e *seqEngine) Close() error             { return nil }
func (e *seqEngine) CopyPages(bridge.Tier, []int32, bridge.Tier, []int32) error {
	return errors.New("seqEngine: no host tier")
}

func (e *seqEngine) Step(desc *bridge.StepDesc, res *bridge.StepResult) error {
	if len(e.inflight) > 0 {
		return errors.New("seqEngine: Step with submitted steps outstanding")
	}
	return e.run(desc, res)
}

func (e *seqEngine) Submit(desc *bridge.StepDesc) error {
	if len(e.inflight) >= bridge.MaxInflight {
		return errors.New("seqEngine: too many steps in flight")
	}
	var res bridge.StepResult
	if err := e.run(desc, &res); err != nil {
		return err
	}
	e.inflight = append(e.inflight, res)
	return nil
}

func (e *seqEngine) Wait(res *bridge.StepResult) error {
	if len(e.inflight) == 0 {
		return errors.New("seqEngine: Wait without a submitted step")
	}
	*res = e.inflight[0]
	e.inflight = e.inflight[1:]
	return nil
}

func mixHash(h uint64, tok int32) uint64 {
	h ^= uint64(uint32(tok)) + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)
	return h * 0x100000001b3
}

func (e *seqEngine) run(desc *bridge.StepDesc, res *bridge.StepResult) error {
	rows := e.plan.rows
	if len(rows) != len(desc.Seqs) {
		return fmt.Errorf("seqEngine rank %d: %d rows but the last pass scheduled %d", e.rank, len(desc.Seqs), len(rows))
	}
	e.steps++
	lb := e.P * e.cp
	res.Sampled = make([]int32, len(desc.Seqs))
	res.DeviceMS = 1
	scored, nrows := desc.WantsScores()
	bridge.ResizeScores(res, nrows, scored)
	row := 0
	for i, sq := range desc.Seqs {
		id := rows[i].id
		end := sq.StartPos + len(sq.Tokens)
		if len(sq.Tokens) == 0 || len(sq.BlockTable)*lb < end {
			return fmt.Errorf("seqEngine rank %d: request %d row [%d, %d) with %d ledger blocks of %d tokens",
				e.rank, id, sq.StartPos, end, len(sq.BlockTable), lb)
		}
		l := e.life[id]
		if l == nil {
			l = &seqLife{}
			e.life[id] = l
		}
		if rows[i].ctx {
			if sq.StartPos == 0 && len(l.tokens) > 0 {
				l.tokens, l.hashes = l.tokens[:0], l.hashes[:0] // recompute: a new incarnation
				l.incarnations++
			}
			l.prefills = append(l.prefills, [2]int{sq.StartPos, end})
		} else {
			if len(sq.Tokens) != 1 {
				return fmt.Errorf("seqEngine rank %d: decode of request %d feeds %d tokens", e.rank, id, len(sq.Tokens))
			}
			l.decodes = append(l.decodes, sq.StartPos)
		}
		if sq.StartPos != len(l.tokens) {
			return fmt.Errorf("seqEngine rank %d: request %d writes from position %d but its KV holds [0, %d)",
				e.rank, id, sq.StartPos, len(l.tokens))
		}
		for k, tok := range sq.Tokens {
			h := uint64(0xcbf29ce484222325)
			if len(l.hashes) > 0 {
				h = l.hashes[len(l.hashes)-1]
			}
			l.tokens = append(l.tokens, tok)
			l.hashes = append(l.hashes, mixHash(h, tok))
			if q := sq.StartPos + k; kvpool.HelixOwner(q, e.P, e.cp) == e.rank {
				e.page(sq.BlockTable[q/lb])[q%e.P] = tok
			}
		}
		// Read back every position this rank owns.
		for q := 0; q < end; q++ {
			if kvpool.HelixOwner(q, e.P, e.cp) != e.rank {
				continue
			}
			if got := e.page(sq.BlockTable[q/lb])[q%e.P]; got != l.tokens[q] {
				return fmt.Errorf("seqEngine rank %d: request %d position %d reads %d, want %d", e.rank, id, q, got, l.tokens[q])
			}
		}
		res.Sampled[i] = -1
		if sq.Sample {
			res.Sampled[i] = int32(l.hashes[end-1] % 509)
			l.sampled = append(l.sampled, res.Sampled[i])
		}
		if scored {
			// Scores of the content up to each row, like its samples.
			for k, t := range sq.ScoreTargets {
				if t < 0 {
					continue
				}
				h, r := l.hashes[sq.StartPos+k], row+k
				res.ScoreLogprobs[r] = -float32((h^uint64(t))%997) / 100
				res.ScoreRanks[r] = int32((h^uint64(t))%7) + 1
				for j := range sq.ScoreTop {
					res.ScoreTopIDs[r*bridge.MaxLogprobs+j] = int32((h + uint64(j)) % 509)
					res.ScoreTopLogprobs[r*bridge.MaxLogprobs+j] = -float32(j)
				}
			}
		}
		row += len(sq.Tokens)
	}
	return nil
}

func (e *seqEngine) page(p int32) []int32 {
	s := e.slab[p]
	if s == nil {
		s = make([]int32, e.P)
		for i := range s {
			s[i] = -1
		}
		e.slab[p] = s
	}
	return s
}

// ---------------------------------------------------------------------------
// Unit-level helpers (one executor, pieces of the loop called directly)
// ---------------------------------------------------------------------------

// unitExec builds rank `rank` of an attention-DP group of `ranks` over a
// fresh kvpool of `pages` pages (P = 8) wrapped by a recKV.
func unitExec(t *testing.T, rank, ranks, pages int, comm nccl.Comm) (*Executor, *recKV, *kvpool.Manager) {
	t.Helper()
	return unitExecWith(t, rank, ranks, pages, comm, nil)
}

// unitExecWith is unitExec with the executor's configuration edited by
// edit (nil: unchanged) before New.
func unitExecWith(t *testing.T, rank, ranks, pages int, comm nccl.Comm, edit func(*Config)) (*Executor, *recKV, *kvpool.Manager) {
	t.Helper()
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, TokensPerPage: 8})
	require.NoError(t, err)
	kv := &recKV{KV: pool}
	sc := defaultSched()
	sch, err := scheduler.New(sc, kv)
	require.NoError(t, err)
	eng, err := fake.New(bridge.Config{Preset: "tiny", NumPages: pages, TokensPerPage: 8, Seed: 1})
	require.NoError(t, err)
	d := Deps{Comm: comm, Engine: eng, KV: kv, Planner: sch}
	if rank == 0 {
		d.Source = &scriptSource{byIter: make([][]Arrival, 1<<20)} // never exhausted, never due
	}
	cfg := Config{Rank: rank, Ranks: ranks, Scheduler: sc, MaxIdleSleep: time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	e, err := New(cfg, d)
	require.NoError(t, err)
	return e, kv, pool
}

// inject places r in e.active (bypassing intake).
func inject(e *Executor, r *request) *request {
	e.active = append(e.active, r)
	e.byID[r.ID] = r
	return r
}

// asGeneration turns r into a generation request with its prompt prefilled
// in pool (one generated token).
func asGeneration(t *testing.T, pool *kvpool.Manager, r *request) *request {
	t.Helper()
	require.True(t, pool.PrepareContext(&r.Request))
	require.True(t, pool.ResizeContext(&r.Request, r.PromptLen))
	r.ContextPosition = r.PromptLen
	pool.UpdateAfterContext(&r.Request)
	r.State = scheduler.GenerationInProgress
	r.output = []int32{1}
	r.Generated = 1
	return r
}

func activeIDs(e *Executor) []uint64 {
	out := []uint64{}
	for _, r := range e.active {
		out = append(out, r.ID)
	}
	return out
}

// onTwo runs fn(rank) on two goroutines (for pieces that enter collectives).
func onTwo(fn func(rank int)) {
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) { defer wg.Done(); fn(r) }(r)
	}
	wg.Wait()
}
