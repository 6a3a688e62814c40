package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// row is one single-pass table scenario of spec §18. Expected lists are
// compared exactly (nil means "empty").
type row struct {
	name string
	cfg  func(*Config)
	kv   func(*fakeKV)
	list []*Request
	exec []uint64

	ctx, gen, paused, recompute []uint64
	chunks                      []int // ChunkSize per Context entry; nil = unchecked
	check                       func(t *testing.T, f *fakeKV, s *Scheduler, out *Output)
}

// baseConfig is the harness default of §18.1: max_batch_size 100, M = 1 024,
// chunking off, prefix-aware on, recompute pause on, MAX_UTILIZATION, P = 64.
func baseConfig() Config {
	c := DefaultConfig()
	c.MaxBatchSize = 100
	c.MaxNumTokens = 1024
	c.LedgerBlockTokens = 64
	return c
}

// chunked turns chunking on with unit u.
func chunked(u int) func(*Config) {
	return func(c *Config) { c.ChunkedContext = true; c.ChunkUnitSize = u }
}

// tokens sets M.
func tokens(m int) func(*Config) { return func(c *Config) { c.MaxNumTokens = m } }

// all combines config edits.
func all(fs ...func(*Config)) func(*Config) {
	return func(c *Config) {
		for _, f := range fs {
			f(c)
		}
	}
}

// host gives the fake a host tier.
func host(f *fakeKV) { f.host = true }

func emptyIfNil(v []uint64) []uint64 {
	if v == nil {
		return []uint64{}
	}
	return v
}

// runRows runs each row as a subtest.
func runRows(t *testing.T, rows []row) {
	t.Helper()
	for _, rw := range rows {
		t.Run(rw.name, func(t *testing.T) {
			f := newFakeKV()
			if rw.kv != nil {
				rw.kv(f)
			}
			f.register(rw.list)
			cfg := baseConfig()
			if rw.cfg != nil {
				rw.cfg(&cfg)
			}
			s, err := New(cfg, f)
			require.NoError(t, err)
			out, err := s.Schedule(rw.list, rw.exec)
			require.NoError(t, err)
			require.Equal(t, emptyIfNil(rw.ctx), ids(out.Context), "Context")
			require.Equal(t, emptyIfNil(rw.gen), ids(out.Generation), "Generation")
			require.Equal(t, emptyIfNil(rw.paused), ids(out.Paused), "Paused")
			require.Equal(t, emptyIfNil(rw.recompute), ids(out.RecomputePaused), "RecomputePaused")
			require.Equal(t, len(out.Context)+len(out.Generation), out.NumFitting, "NumFitting")
			if rw.chunks != nil {
				require.Equal(t, rw.chunks, chunks(out.Context), "chunks")
			}
			if rw.check != nil {
				rw.check(t, f, s, out)
			}
		})
	}
}

// mustNew builds a scheduler or fails the test.
func mustNew(t *testing.T, cfg Config, kv KVManager) *Scheduler {
	t.Helper()
	s, err := New(cfg, kv)
	require.NoError(t, err)
	return s
}

// gens returns gen(from) … gen(to-1).
func gens(from, to int) []*Request {
	var l []*Request
	for i := from; i < to; i++ {
		l = append(l, gen(uint64(i)))
	}
	return l
}

func seq(from, to int) []uint64 {
	var l []uint64
	for i := from; i < to; i++ {
		l = append(l, uint64(i))
	}
	return l
}
