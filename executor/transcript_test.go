package executor_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/internal/transcript"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// rewrite regenerates the expected output of the transcripts in testdata/:
//
//	go test ./executor/ -run TestTranscripts -rewrite
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of executor/testdata/*.txt")

// TestTranscripts plays the stories of testdata/*.txt: a fleet of
// attention-DP ranks over the in-process collective group (nccl local
// group) and the fake engine, fed a scripted list of requests, run to the
// end; then the story reads what the fleet did, iteration by iteration,
// through what the executor exposes: each rank's iteration log
// (executor.IterRecord JSON lines), its planner's outputs (Deps.Planner)
// and the collectives it entered (the local comm's Trace, with the payload
// sizes a pass-through Comm saw). Commands:
//
//	config [ranks=2] [pages=N] [page=P] [host=N] [batch=N] [max_num_tokens=N]
//	       [chunking=on] [unit=N] [policy=max_utilization|guaranteed_no_evict]
//	       [recompute=on] [overlap=off] [events=N] [reuse=off]
//	                           a new fleet (forgets every request)
//	request id=N (prompt=N | tokens=1..8,9) [max_new=N] [at=ITER] [rank=R] [strict=on]
//	                           a request arriving in iteration ITER (default 0),
//	                           optionally targeted at rank R
//	run                        runs the fleet until every rank exits
//	iters [from=N] [to=N]      the iterations [from, to] (default: all), each as
//	                           "iter N", one plan line per rank and one trace line
//	responses                  rank 0's responses in id order
//	events                     the published KV event stream (rank 0's
//	                           EventSink, JSON lines as written)
//	pools                      every rank's KV pool after the run
//
// A plan line reads "rN: ctx ID+CHUNK@POS ... | gen IDS | paused IDS |
// rec IDS | can_queue yes/no [| dummy] | kv UTIL"; a padding dummy prints
// as dK (the K-th dummy of its rank). A trace line lists the iteration's
// collectives in order: "allgather:NAME B0/B1" (each rank's payload bytes),
// "broadcast:NAME B" (the bytes received), "allreduce:NAME OP×N" (values).
// The iteration of a collective is counted by the rank-state allgather
// that opens every attention-DP iteration (executor.md §3); the exit
// iteration carries the final statistics.
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, "testdata/*.txt", *rewrite, func(t *testing.T) func(*transcript.Command) string {
		s := &fleetStory{t: t}
		return s.do
	})
}

// fleetStory is one transcript's state.
type fleetStory struct {
	t     *testing.T
	cfg   fleetConfig
	reqs  []storyRequest
	ranks []*storyRank // after run
	iters int64
}

type fleetConfig struct {
	ranks, pages, page, host, events int
	overlap, reuse                   bool
	sched                            scheduler.Config
}

type storyRequest struct {
	at int
	a  executor.Arrival
}

// storyRank is one rank of the fleet and what it recorded.
type storyRank struct {
	rank   int
	comm   *traceComm
	pool   *kvpool.Manager
	plan   *planRecorder
	log    bytes.Buffer
	events bytes.Buffer // the published KV event stream (rank 0)
	recs   map[int64]executor.IterRecord
	result *executor.Result
	err    error
}

func (s *fleetStory) do(c *transcript.Command) string {
	switch c.Name {
	case "config":
		return s.config(c)
	case "request":
		return s.request(c)
	case "run":
		return s.run(c)
	case "iters":
		s.ran(c)
		last := int(s.iters)
		return s.itersText(c.Int("from", 0), c.Int("to", last))
	case "responses":
		s.ran(c)
		return s.responses()
	case "pools":
		s.ran(c)
		return s.pools()
	case "events":
		s.ran(c)
		return strings.TrimSpace(s.ranks[0].events.String())
	}
	c.Fatalf("unknown command %q", c.Name)
	return ""
}

func (s *fleetStory) ran(c *transcript.Command) {
	if s.ranks == nil {
		c.Fatalf("run first")
	}
}

func (s *fleetStory) config(c *transcript.Command) string {
	sc := scheduler.DefaultConfig()
	sc.MaxBatchSize = c.Int("batch", 8)
	sc.MaxNumTokens = c.Int("max_num_tokens", 64)
	sc.ChunkedContext = c.Bool("chunking", true)
	page := c.Int("page", 4)
	sc.ChunkUnitSize = c.Int("unit", page)
	sc.LedgerBlockTokens = page
	sc.RecomputePause = c.Bool("recompute", true)
	pol, err := scheduler.ParsePolicy(c.Str("policy", "max_utilization"))
	if err != nil {
		c.Fatalf("%v", err)
	}
	sc.Policy = pol
	s.cfg = fleetConfig{ranks: c.Int("ranks", 2), pages: c.Int("pages", 16), page: page, host: c.Int("host", 0),
		events: c.Int("events", 0), overlap: c.Bool("overlap", false), reuse: c.Bool("reuse", false), sched: sc}
	s.reqs, s.ranks = nil, nil
	kv, err := kvpool.New(kvpool.Config{NumPages: s.cfg.pages, TokensPerPage: page})
	if err != nil {
		return "error: " + err.Error()
	}
	sch, err := scheduler.New(sc, kv)
	if err != nil {
		return "error: " + err.Error()
	}
	loop := "non-overlap"
	if s.cfg.overlap {
		loop = "overlap"
	}
	return fmt.Sprintf("%d attention-DP ranks, %d pages of %d tokens per rank, host %d, %s loop, events %d\n%s",
		s.cfg.ranks, s.cfg.pages, page, s.cfg.host, loop, s.cfg.events, sch.Describe())
}

func (s *fleetStory) request(c *transcript.Command) string {
	id := uint64(c.Int("id", 0))
	var prompt []int32
	for _, x := range c.Ints("tokens") {
		prompt = append(prompt, int32(x))
	}
	if n := c.Int("prompt", 0); n > 0 {
		if prompt != nil {
			c.Fatalf("prompt= or tokens=, not both")
		}
		for i := range n {
			prompt = append(prompt, int32((int(id)*131+i*7+3)%509))
		}
	}
	if len(prompt) == 0 {
		c.Fatalf("a request needs prompt=N or tokens=")
	}
	a := executor.Arrival{ID: id, Prompt: prompt, MaxNewTokens: c.Int("max_new", 4)}
	if c.Has("rank") {
		a.Routing = workload.Routing{HasRank: true, Rank: c.Int("rank", 0), Strict: c.Bool("strict", false)}
	}
	s.reqs = append(s.reqs, storyRequest{at: c.Int("at", 0), a: a})
	return ""
}

// run builds the fleet and runs every rank's loop to its end.
func (s *fleetStory) run(c *transcript.Command) string {
	cfg := s.cfg
	if cfg.ranks == 0 {
		c.Fatalf("config first")
	}
	src := &scriptedSource{}
	for _, r := range s.reqs {
		for len(src.byIter) <= r.at {
			src.byIter = append(src.byIter, nil)
		}
		src.byIter[r.at] = append(src.byIter[r.at], r.a)
	}
	comms := nccl.NewLocalGroup(cfg.ranks, nccl.LocalOptions{Timeout: 20 * time.Second})
	s.ranks = make([]*storyRank, cfg.ranks)
	execs := make([]*executor.Executor, cfg.ranks)
	for i := range s.ranks {
		rr := &storyRank{rank: i, comm: &traceComm{local: comms[i]}, recs: map[int64]executor.IterRecord{}}
		pool, err := kvpool.New(kvpool.Config{NumPages: cfg.pages, TokensPerPage: cfg.page, HostPages: cfg.host,
			EnableBlockReuse: cfg.reuse || cfg.events > 0, EventBufferMaxSize: cfg.events,
			AttentionDP: cfg.ranks > 1, AttentionDPRank: i})
		if err != nil {
			return "error: " + err.Error()
		}
		rr.pool = pool
		sch, err := scheduler.New(cfg.sched, pool)
		if err != nil {
			return "error: " + err.Error()
		}
		rr.plan = &planRecorder{inner: sch}
		eng, err := fake.New(bridge.Config{Preset: "tiny", NumPages: cfg.pages, NumHostPages: cfg.host,
			TokensPerPage: cfg.page, Seed: 1})
		if err != nil {
			return "error: " + err.Error()
		}
		d := executor.Deps{Comm: rr.comm, Engine: eng, KV: pool, Planner: rr.plan}
		if i == 0 {
			d.Source = src
		}
		ec := executor.Config{Rank: i, Ranks: cfg.ranks, Scheduler: cfg.sched, Overlap: cfg.overlap,
			IterLog: &rr.log, MaxIdleSleep: time.Millisecond, Events: cfg.events > 0,
			EventBufferMaxSize: cfg.events, EventSink: &rr.events}
		if execs[i], err = executor.New(ec, d); err != nil {
			return "error: " + err.Error()
		}
		s.ranks[i] = rr
	}
	var wg sync.WaitGroup
	for i, rr := range s.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rr.result, rr.err = execs[i].Run(); rr.err != nil {
				rr.comm.Close()
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, rr := range s.ranks {
		errs = append(errs, rr.err)
	}
	if err := errors.Join(errs...); err != nil {
		return "error: " + err.Error()
	}
	return s.check(c)
}

// check decodes the iteration logs and cross-checks the recordings: every
// rank ran the same iterations and entered the same collectives, the
// pass-through comm saw what the local comm traced, one planner pass and one
// log record per iteration.
func (s *fleetStory) check(c *transcript.Command) string {
	s.iters = s.ranks[0].result.Iterations
	base := s.ranks[0].comm.local.Trace()
	for _, rr := range s.ranks {
		if rr.result.Iterations != s.iters {
			c.Fatalf("rank %d ran %d iterations, rank 0 %d", rr.rank, rr.result.Iterations, s.iters)
		}
		if tr := rr.comm.local.Trace(); !slices.Equal(tr, base) {
			c.Fatalf("rank %d's collective trace differs from rank 0's:\n%v\n%v", rr.rank, tr, base)
		}
		if len(rr.comm.log) != len(base) {
			c.Fatalf("rank %d: the pass-through comm saw %d collectives, the trace has %d", rr.rank, len(rr.comm.log), len(base))
		}
		for k, e := range base {
			if got := rr.comm.log[k]; got.kind != e.Kind || got.name != e.Name {
				c.Fatalf("rank %d collective %d: saw %s:%s, traced %s", rr.rank, k, got.kind, got.name, e)
			}
		}
		for _, line := range bytes.Split(bytes.TrimSpace(rr.log.Bytes()), []byte("\n")) {
			var rec executor.IterRecord
			if err := json.Unmarshal(line, &rec); err != nil {
				c.Fatalf("rank %d iteration log: %v", rr.rank, err)
			}
			if _, dup := rr.recs[rec.Iter]; dup {
				c.Fatalf("rank %d logged iteration %d twice", rr.rank, rec.Iter)
			}
			rr.recs[rec.Iter] = rec
		}
		if n := len(rr.comm.byIteration()); n != int(s.iters)+1 {
			c.Fatalf("rank %d: %d rank-state gathers for %d iterations and the exit", rr.rank, n, s.iters)
		}
		if len(rr.recs) != int(s.iters) || len(rr.plan.passes) != int(s.iters) {
			c.Fatalf("rank %d: %d iterations, %d log records, %d planner passes", rr.rank, s.iters, len(rr.recs), len(rr.plan.passes))
		}
	}
	res := s.ranks[0].result
	return fmt.Sprintf("%d iterations, %d with a forward; every rank entered the same %d collectives; %d responses",
		res.Iterations, res.ForwardIterations, len(base), len(res.Responses))
}

// itersText prints iterations from..to (to = the exit iteration at most).
func (s *fleetStory) itersText(from, to int) string {
	perRank := make([][][]collective, len(s.ranks))
	for i, rr := range s.ranks {
		perRank[i] = rr.comm.byIteration()
	}
	var b strings.Builder
	for it := from; it <= to && it <= int(s.iters); it++ {
		if it == int(s.iters) {
			fmt.Fprintf(&b, "iter %d: exit\n", it)
		} else {
			fmt.Fprintf(&b, "iter %d\n", it)
			for _, rr := range s.ranks {
				b.WriteString("  " + s.planLine(rr, int64(it)) + "\n")
			}
		}
		b.WriteString("  trace:")
		for k, col := range perRank[0][it] {
			if k > 0 {
				b.WriteString(",")
			}
			b.WriteString(" " + string(col.kind) + ":" + col.name + " ")
			switch col.kind {
			case nccl.KindAllGather:
				sizes := make([]string, len(s.ranks))
				for r := range s.ranks {
					sizes[r] = strconv.Itoa(perRank[r][it][k].size)
				}
				b.WriteString(strings.Join(sizes, "/"))
			case nccl.KindAllReduce:
				fmt.Fprintf(&b, "%s×%d", col.op, col.size)
			default:
				b.WriteString(strconv.Itoa(col.size))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// planLine is one rank's plan of iteration it: the context chunks as the
// iteration log has them, the other lists from the planner's output (their
// counts checked against the log).
func (s *fleetStory) planLine(rr *storyRank, it int64) string {
	rec, pass := rr.recs[it], rr.plan.passes[it]
	var ctx []string
	for i, id := range rec.CtxRequestIDs {
		ctx = append(ctx, fmt.Sprintf("%d+%d@%d", id, rec.CtxChunkTokens[i], rec.CtxKVStart[i]))
	}
	if !slices.Equal(rec.CtxRequestIDs, pass.ctx) {
		s.t.Errorf("rank %d iteration %d: the log's context requests %v, the planner's %v", rr.rank, it, rec.CtxRequestIDs, pass.ctx)
	}
	real := 0
	var gen []string
	for _, id := range pass.gen {
		if id >= dummyIDBase {
			gen = append(gen, fmt.Sprintf("d%d", id-dummyIDBase))
			continue
		}
		real++
		gen = append(gen, strconv.FormatUint(id, 10))
	}
	if real != rec.NumGenRequests || len(pass.paused) != rec.NumPaused || len(pass.rec) != rec.NumRecomputePaused {
		s.t.Errorf("rank %d iteration %d: the log counts gen %d paused %d rec %d, the planner %d %d %d", rr.rank, it,
			rec.NumGenRequests, rec.NumPaused, rec.NumRecomputePaused, real, len(pass.paused), len(pass.rec))
	}
	yes := map[bool]string{true: "yes", false: "no"}
	line := fmt.Sprintf("r%d: ctx %s | gen %s | paused %s | rec %s | can_queue %s", rr.rank, orDash(ctx), orDash(gen),
		idList(pass.paused), idList(pass.rec), yes[rec.CanQueue])
	if rec.ADPDummy {
		line += " | dummy"
	}
	return line + fmt.Sprintf(" | kv %.3f", rec.KVUtil)
}

func (s *fleetStory) responses() string {
	rs := slices.Clone(s.ranks[0].result.Responses)
	slices.SortFunc(rs, func(a, b executor.Response) int { return cmp.Compare(a.ID, b.ID) })
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%d: rank %d output %v suspended %d recomputed %d", r.ID, r.Rank, r.Output, r.Suspended, r.Recomputed)
		if r.Error != "" {
			b.WriteString(" error " + r.Error)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (s *fleetStory) pools() string {
	var b strings.Builder
	for _, rr := range s.ranks {
		p := rr.pool
		fmt.Fprintf(&b, "r%d: %d of %d pages free, %d cached, %d sequences", rr.rank, p.FreePages(), p.TotalPages(),
			p.CachedPages(), p.NumSequences())
		if err := p.CheckInvariants(); err != nil {
			fmt.Fprintf(&b, ", invariants: %v", err)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// dummyIDBase is the first padding dummy id (executor.md §4.2: ids ≥ 2^63).
const dummyIDBase = uint64(1) << 63

func orDash(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, " ")
}

func idList(ids []uint64) string {
	var s []string
	for _, id := range ids {
		s = append(s, strconv.FormatUint(id, 10))
	}
	return orDash(s)
}

// scriptedSource hands rank 0 its arrivals by iteration: the k-th call of
// Due (one per iteration) returns byIter[k]; exhausted once every slot was
// handed out. It never makes rank 0 wait.
type scriptedSource struct {
	byIter [][]executor.Arrival
	calls  int
}

func (s *scriptedSource) Due(time.Time) []executor.Arrival {
	var out []executor.Arrival
	if s.calls < len(s.byIter) {
		out = s.byIter[s.calls]
	}
	s.calls++
	return out
}

func (s *scriptedSource) Exhausted() bool { return s.calls >= len(s.byIter) }

func (s *scriptedSource) NextArrival() time.Time {
	if s.Exhausted() {
		return time.Time{}
	}
	return time.Now()
}

func (s *scriptedSource) Total() int {
	n := 0
	for _, a := range s.byIter {
		n += len(a)
	}
	return n
}

// planPass is what one Schedule call returned, copied at once (the
// executor changes the requests afterwards).
type planPass struct {
	ctx, gen, paused, rec []uint64
}

// planRecorder wraps a rank's scheduler and records every pass.
type planRecorder struct {
	inner  executor.Planner
	passes []planPass
}

func (p *planRecorder) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	out, err := p.inner.Schedule(active, executing)
	if err != nil {
		return nil, err
	}
	ids := func(rs []*scheduler.Request) []uint64 {
		out := []uint64{}
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	p.passes = append(p.passes, planPass{ctx: ids(out.Context), gen: ids(out.Generation),
		paused: ids(out.Paused), rec: ids(out.RecomputePaused)})
	return out, nil
}

// collective is one collective as a rank entered it: size is its own
// payload (allgather), the payload received (broadcast) or the number of
// values (allreduce).
type collective struct {
	kind nccl.Kind
	name string
	size int
	op   nccl.ReduceOp
}

// traceComm passes every call through to the rank's local comm and notes
// the payload sizes the local trace does not keep.
type traceComm struct {
	local *nccl.LocalComm
	log   []collective
}

func (c *traceComm) Rank() int    { return c.local.Rank() }
func (c *traceComm) Size() int    { return c.local.Size() }
func (c *traceComm) Close() error { return c.local.Close() }

func (c *traceComm) AllGather(name string, data []byte) ([][]byte, error) {
	c.log = append(c.log, collective{kind: nccl.KindAllGather, name: name, size: len(data)})
	return c.local.AllGather(name, data)
}

func (c *traceComm) Broadcast(name string, root int, data []byte) ([]byte, error) {
	out, err := c.local.Broadcast(name, root, data)
	c.log = append(c.log, collective{kind: nccl.KindBroadcast, name: name, size: len(out)})
	return out, err
}

func (c *traceComm) AllReduceInt64(name string, op nccl.ReduceOp, vals []int64) ([]int64, error) {
	c.log = append(c.log, collective{kind: nccl.KindAllReduce, name: name, size: len(vals), op: op})
	return c.local.AllReduceInt64(name, op, vals)
}

// byIteration splits the log at each rank-state allgather, the first
// collective of every attention-DP iteration.
func (c *traceComm) byIteration() [][]collective {
	var out [][]collective
	for _, col := range c.log {
		if col.kind == nccl.KindAllGather && col.name == "rank_state" || len(out) == 0 {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], col)
	}
	return out
}
