package executor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
	"github.com/lockstep-ai/lockstep/scheduler/router"
	"github.com/lockstep-ai/lockstep/workload"
)

// twinFleet runs the real executor, scheduler, router and KV pool of every
// rank over the twin engine, as coroutines on a virtual clock — the digital
// twin without the worker around it.
type twinFleet struct {
	ranks   int
	gpu     string
	model   string
	reqs    []workload.Request
	overlap bool
	sched   scheduler.Config
	// costCal runs the online calibrator (sched.CostMode must be auto);
	// notes collects every rank's notes.
	costCal *costfit.Settings
	notes   [][]string
	// logs, when set, receive every rank's iteration log.
	logs []*recordingWriter
}

// run returns rank 0's result and the summed scheduler passes of every rank.
func (f *twinFleet) run(tb testing.TB) (*Result, int64) {
	tb.Helper()
	p, err := twin.BuiltinProfile(f.gpu, f.model, twin.Parallelism{})
	if err != nil {
		tb.Fatal(err)
	}
	if p, err = p.WithRanks(f.ranks); err != nil {
		tb.Fatal(err)
	}
	const ppt = 32
	pages, err := p.PoolPages(ppt)
	if err != nil {
		tb.Fatal(err)
	}
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := nccl.NewCoroGroup(f.ranks, false)
	results := make([]*Result, f.ranks)
	passes := make([]int64, f.ranks)
	f.notes = make([][]string, f.ranks)
	errs := nccl.RunCoroutines(g, func(i int, c *nccl.CoroComm) error {
		kv, err := kvpool.New(kvpool.Config{NumPages: pages, TokensPerPage: ppt, EnableBlockReuse: true,
			AttentionDP: f.ranks > 1, AttentionDPRank: i, PageTableRows: 2*f.sched.MaxBatchSize + 1})
		if err != nil {
			return err
		}
		sc := f.sched
		sc.LedgerBlockTokens = ppt
		sch, err := scheduler.New(sc, kv)
		if err != nil {
			return err
		}
		eng, err := twin.New(bridge.Config{NumPages: pages, TokensPerPage: ppt, Seed: 1}, p)
		if err != nil {
			return err
		}
		rt, err := router.New("conversation", router.Config{MaxActivePerRank: 1024})
		if err != nil {
			return err
		}
		counter := &countingPlanner{inner: sch}
		ex, err := New(Config{Rank: i, Ranks: f.ranks, Scheduler: sc, Overlap: f.overlap, Router: rt,
			VirtualClock: true, VirtualEpoch: epoch, CostCalibration: f.costCal, IterLog: f.iterLog(i),
			OnNote: func(rank int, n scheduler.Note) { f.notes[rank] = append(f.notes[rank], n.Text) }},
			Deps{Comm: c, Engine: eng, KV: kv, Planner: counter})
		if err != nil {
			return err
		}
		if i == 0 {
			ex.SetSource(NewTraceSource(f.reqs, epoch), nil)
		}
		results[i], err = ex.Run()
		passes[i] = counter.passes
		return err
	})
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	var total int64
	for _, n := range passes {
		total += n
	}
	return results[0], total
}

// iterLog is rank i's iteration log writer, or nil.
func (f *twinFleet) iterLog(i int) io.Writer {
	if f.logs == nil {
		return nil
	}
	return f.logs[i]
}

// countingPlanner counts scheduler passes.
type countingPlanner struct {
	inner  Planner
	passes int64
}

// PublishCost forwards the calibrator's publications.
func (p *countingPlanner) PublishCost(o, d int64) error {
	return p.inner.(CostPublisher).PublishCost(o, d)
}

func (p *countingPlanner) Schedule(active []*scheduler.Request, executing []uint64) (*scheduler.Output, error) {
	p.passes++
	return p.inner.Schedule(active, executing)
}

// conversationTrace reads the first n requests of the shared Mooncake
// conversation trace at their real lengths.
func conversationTrace(tb testing.TB, n int) []workload.Request {
	tb.Helper()
	path := filepath.Join("..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		tb.Fatalf("the Mooncake traces are expected in ../shared/data/mooncake beside the repository: %v", err)
	}
	reqs, err := workload.ReadFile(path, workload.Options{Limit: n, LengthScale: 1, ArrivalScale: 1,
		VocabSize: 128256, Seed: 1})
	if err != nil {
		tb.Fatal(err)
	}
	return reqs
}

// BenchmarkTwinFleet is the twin's scale benchmark: the first 1 000
// requests of the Mooncake conversation trace at real lengths and real
// arrival times on 8 and 64 attention-DP ranks of llama-8b on H200, every
// rank's executor, scheduler, router and KV pool for real, the engine
// modelled. It reports simulated rank-iterations per wall second.
func BenchmarkTwinFleet(b *testing.B) {
	reqs := conversationTrace(b, 1000)
	for _, ranks := range []int{8, 64} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			sc := scheduler.Config{MaxBatchSize: 256, MaxNumTokens: 8192, ChunkedContext: true, ChunkUnitSize: 32,
				Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true}
			var rankIters, passes int64
			var wall time.Duration
			var virt time.Duration
			for i := 0; i < b.N; i++ {
				f := &twinFleet{ranks: ranks, gpu: "h200", model: "llama-8b", reqs: reqs, overlap: true, sched: sc}
				start := time.Now()
				res, n := f.run(b)
				wall += time.Since(start)
				rankIters += res.Iterations * int64(ranks)
				passes += n
				virt += res.VirtualEnd.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(rankIters)/wall.Seconds(), "rank-iters/s")
			b.ReportMetric(float64(rankIters)/float64(b.N), "rank-iters/run")
			b.ReportMetric(virt.Seconds()/float64(b.N), "virtual-s/run")
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		})
	}
}
