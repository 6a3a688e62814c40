package executor

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"github.com/lockstep-ai/lockstep/structured"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/fake"
	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/nccl"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/workload"
)

// fleet is an in-process group of executors over the fake engine.
type fleet struct {
	ranks   int
	overlap bool
	pages   int
	ppt     int // tokens per page
	sched   scheduler.Config
	reqs    []workload.Request
	comms   []*nccl.LocalComm
	kvs     []*kvpool.Manager
	execs   []*Executor
	results []*Result
	errs    []error
	iterLog []*recordingWriter
	// newEngine overrides the fake engine (fault injection).
	newEngine func(rank int, cfg bridge.Config) (bridge.Engine, error)
	// events > 0 turns on prefix reuse and KV events (that per-flush limit);
	// rank 0 writes the published stream to eventLog.
	events   int
	eventLog *recordingWriter
	// source replaces the all-at-once trace source; wrap wraps each rank's
	// scheduler (fault injection, scripted skips).
	source Source
	wrap   func(rank int, p Planner) Planner
	// stopTokens end requests with StopAtEOS.
	stopTokens []int32
	// guides compiles the arrivals' guides (Config.Guides).
	guides *structured.Cache
	// balance is every rank's ADP Balance setting.
	balance ADPBalance
	// maxActive is every rank's cap H (Config.MaxActivePerRank; 0: the default).
	maxActive int
	// onIteration is rank 0's Config.OnIteration; with it every rank
	// streams (Config.Stream), as a server's ranks do.
	onIteration func(FleetStats)
	// onTokens is rank 0's Config.OnTokens; with it every rank streams.
	onTokens func([]TokenDelta)
	// idlePoll is every rank's Config.IdlePoll; wrapComm wraps each rank's
	// comm (a doorbell recorder).
	idlePoll time.Duration
	wrapComm func(rank int, c *nccl.LocalComm) nccl.Comm
}

type recordingWriter struct {
	mu    sync.Mutex
	lines [][]byte
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, append([]byte(nil), b...))
	return len(b), nil
}

func defaultSched() scheduler.Config {
	return scheduler.Config{MaxBatchSize: 16, MaxNumTokens: 64, ChunkedContext: true, ChunkUnitSize: 8,
		Policy: scheduler.MaxUtilization, RecomputePause: true, PrefixAware: true, LedgerBlockTokens: 8}
}

// sampleRequests builds n small requests with shared prefixes, all arriving at once.
func sampleRequests(t testing.TB, n int, scale float64) []workload.Request {
	reqs, err := workload.Sample(workload.Options{Limit: n, LengthScale: scale, VocabSize: 512, Seed: 7})
	require.NoError(t, err)
	return reqs
}

func (f *fleet) run(t testing.TB) {
	t.Helper()
	if f.ppt == 0 {
		f.ppt = 8
	}
	if f.pages == 0 {
		f.pages = 256
	}
	if f.sched.MaxBatchSize == 0 {
		f.sched = defaultSched()
	}
	f.sched.LedgerBlockTokens = f.ppt
	f.comms = nccl.NewLocalGroup(f.ranks, nccl.LocalOptions{Timeout: 20 * time.Second})
	source := f.source
	if source == nil {
		source = NewTraceSource(f.reqs, time.Now())
	}
	f.eventLog = &recordingWriter{}
	f.execs = make([]*Executor, f.ranks)
	f.kvs = make([]*kvpool.Manager, f.ranks)
	f.iterLog = make([]*recordingWriter, f.ranks)
	for i := 0; i < f.ranks; i++ {
		cfg := bridge.Config{Preset: "tiny", NumPages: f.pages, TokensPerPage: f.ppt, Seed: 1}
		var eng bridge.Engine
		var err error
		if f.newEngine != nil {
			eng, err = f.newEngine(i, cfg)
		} else {
			eng, err = fake.New(cfg)
		}
		require.NoError(t, err)
		kv, err := kvpool.New(kvpool.Config{NumPages: f.pages, TokensPerPage: f.ppt, EnableBlockReuse: f.events > 0,
			EventBufferMaxSize: f.events, AttentionDP: f.ranks > 1, AttentionDPRank: i})
		require.NoError(t, err)
		f.kvs[i] = kv
		sch, err := scheduler.New(f.sched, kv)
		require.NoError(t, err)
		f.iterLog[i] = &recordingWriter{}
		var planner Planner = sch
		if f.wrap != nil {
			planner = f.wrap(i, sch)
		}
		var comm nccl.Comm = f.comms[i]
		if f.wrapComm != nil {
			comm = f.wrapComm(i, f.comms[i])
		}
		d := Deps{Comm: comm, Engine: eng, KV: kv, Planner: planner}
		if i == 0 {
			d.Source = source
		}
		ecfg := Config{Rank: i, Ranks: f.ranks, StopTokens: f.stopTokens, Guides: f.guides, Scheduler: f.sched, IterLog: f.iterLog[i],
			MaxIdleSleep: time.Millisecond, Overlap: f.overlap, Events: f.events > 0, EventSink: f.eventLog,
			EventBufferMaxSize: f.events, ADPBalance: f.balance, MaxActivePerRank: f.maxActive, IdlePoll: f.idlePoll}
		if f.onTokens != nil {
			ecfg.Stream = true
			if i == 0 {
				ecfg.OnTokens = f.onTokens
			}
		}
		if f.onIteration != nil {
			// As a server sets it up (fleet/rank.go): the serving gathers
			// on every rank, the hook on rank 0's alone.
			ecfg.Stream = true
			if i == 0 {
				ecfg.OnIteration = f.onIteration
			}
		}
		f.execs[i], err = New(ecfg, d)
		require.NoError(t, err)
	}
	f.results = make([]*Result, f.ranks)
	f.errs = make([]error, f.ranks)
	var wg sync.WaitGroup
	for i := range f.execs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			f.results[i], f.errs[i] = f.execs[i].Run()
			if f.errs[i] != nil {
				f.comms[i].Close()
			}
		}(i)
	}
	wg.Wait()
}

// mustRun runs the fleet and requires that no rank failed; it returns f.
func (f *fleet) mustRun(t *testing.T) *fleet {
	t.Helper()
	f.run(t)
	for _, err := range f.errs {
		require.NoError(t, err)
	}
	return f
}

// digest hashes rank 0's responses in request order.
func (f *fleet) digest(t testing.TB) string {
	out := make([][]int32, len(f.reqs))
	seen := make([]bool, len(f.reqs))
	for _, r := range f.results[0].Responses {
		require.False(t, seen[r.ID], "request %d answered twice", r.ID)
		require.Empty(t, r.Error, "request %d rejected", r.ID)
		seen[r.ID] = true
		out[r.ID] = r.Output
	}
	h := sha256.New()
	for i, o := range out {
		require.True(t, seen[i], "request %d never answered", i)
		if !f.reqs[i].StopAtEOS {
			require.Len(t, o, f.reqs[i].MaxNewTokens, "request %d output length", i)
		}
		var b []byte
		b = binary.LittleEndian.AppendUint64(b, uint64(i))
		for _, x := range o {
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (f *fleet) requireNoErrors(t testing.TB) {
	t.Helper()
	var msgs []string
	for i, err := range f.errs {
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("rank %d: %v", i, err))
		}
	}
	require.Empty(t, msgs)
}

// requireEqualTraces checks that every rank entered the same collectives.
func (f *fleet) requireEqualTraces(t testing.TB) {
	t.Helper()
	base := f.comms[0].Trace()
	require.NotEmpty(t, base)
	for i := 1; i < f.ranks; i++ {
		require.Equal(t, base, f.comms[i].Trace(), "collective trace of rank %d differs from rank 0", i)
	}
}
