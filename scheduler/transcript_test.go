package scheduler_test

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/transcript"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/sim"
)

// rewrite regenerates the expected output of the transcripts in testdata/:
//
//	go test ./scheduler/ -run TestTranscripts -rewrite
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of scheduler/testdata/*.txt")

// A transcript (testdata/*.txt) is a story of directives, each followed by
// "----" and its expected output, then a blank line. Lines starting with '#'
// between directives are commentary. Directives:
//
//	config key=value ...   new scheduler and fake pool (keys below); forgets all requests
//	add id=N prompt=N max_new=N [arrive=N] [position=N] [generated=N] [est=N]
//	run N                  N iterations, one line each:
//	                       "<it>: ctx id+chunk@pos ... | gen ids | susp ids | rec ids | dem ids | cost N | done ids | avail N"
//	state                  the active list: id, state, position/prompt, generated
//
// config keys: batch, max_num_tokens (or "unlimited"), chunking (on/off),
// unit, policy, recompute (on/off), host (on/off), pages, page, o, d, r, u, k.
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, "testdata/*.txt", *rewrite, func(t *testing.T) func(*transcript.Command) string {
		h := &story{t: t}
		return func(c *transcript.Command) string { return h.do(c.RawLine()) }
	})
}

// story is the state of one transcript.
type story struct {
	t     *testing.T
	cfg   scheduler.Config
	kv    *scheduler.FakeKV
	sim   *sim.Sim
	specs []sim.Spec
}

func args(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func (h *story) num(a map[string]string, key string, def int64) int64 {
	v, ok := a[key]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		h.t.Fatalf("%s=%q: %v", key, v, err)
	}
	return n
}

func (h *story) do(cmd string) string {
	f := strings.Fields(cmd)
	a := args(f[1:])
	switch f[0] {
	case "config":
		return h.config(a)
	case "add":
		sp := sim.Spec{ID: uint64(h.num(a, "id", 0)), Arrive: int(h.num(a, "arrive", 0)),
			PromptLen: int(h.num(a, "prompt", 0)), Position: int(h.num(a, "position", 0)),
			MaxNewTokens: int(h.num(a, "max_new", 1)), Generated: int(h.num(a, "generated", 0)),
			UncachedEstimate: h.num(a, "est", scheduler.UnsetEstimate)}
		if h.sim != nil {
			if err := h.sim.Add(sp); err != nil {
				return "error: " + err.Error()
			}
			return ""
		}
		h.specs = append(h.specs, sp)
		return ""
	case "run":
		return h.run(int(h.num(args([]string{"n=" + f[1]}), "n", 1)))
	case "state":
		return h.state()
	}
	h.t.Fatalf("unknown directive %q", cmd)
	return ""
}

func (h *story) config(a map[string]string) string {
	c := scheduler.DefaultConfig()
	c.MaxBatchSize = int(h.num(a, "batch", 100))
	if a["max_num_tokens"] == "unlimited" {
		c.MaxNumTokens = scheduler.Unlimited
	} else {
		c.MaxNumTokens = int(h.num(a, "max_num_tokens", 1024))
	}
	c.ChunkedContext = a["chunking"] == "on"
	page := int(h.num(a, "page", 64))
	c.LedgerBlockTokens = page
	c.ChunkUnitSize = int(h.num(a, "unit", int64(page)))
	if p, ok := a["policy"]; ok {
		pol, err := scheduler.ParsePolicy(p)
		if err != nil {
			return "error: " + err.Error()
		}
		c.Policy = pol
	}
	c.RecomputePause = a["recompute"] != "off"
	c.EqualCost = scheduler.EqualCost{KVOffset: h.num(a, "o", 0), KVDepthThreshold: h.num(a, "d", 0), PerChunkDepthTokens: h.num(a, "r", 0)}
	c.Demotion = scheduler.Demotion{UncachedTokens: h.num(a, "u", 0), MaxIters: h.num(a, "k", 0)}
	h.kv = scheduler.NewFakeKV()
	h.kv.SetPool(page, int(h.num(a, "pages", 0)), a["host"] == "on")
	h.cfg, h.sim, h.specs = c, nil, nil
	s, err := scheduler.New(c, h.kv)
	if err != nil {
		return "error: " + err.Error()
	}
	return s.Describe()
}

func (h *story) start() {
	if h.sim != nil {
		return
	}
	s, err := scheduler.New(h.cfg, h.kv)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sim, err = sim.New(s, h.kv, h.specs)
	if err != nil {
		h.t.Fatal(err)
	}
}

func list(ids []uint64) string {
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, " ")
}

func (h *story) run(n int) string {
	h.start()
	var b strings.Builder
	for i := 0; i < n; i++ {
		rec, _, err := h.sim.Step()
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
			break
		}
		var ctx []string
		for _, c := range rec.Context {
			ctx = append(ctx, fmt.Sprintf("%d+%d@%d", c.ID, c.Chunk, c.Position))
		}
		cs := "-"
		if len(ctx) > 0 {
			cs = strings.Join(ctx, " ")
		}
		fmt.Fprintf(&b, "%d: ctx %s | gen %s | susp %s | rec %s", rec.Iteration, cs, list(rec.Generation), list(rec.Suspended), list(rec.RecomputePaused))
		if len(rec.Demoted) > 0 {
			fmt.Fprintf(&b, " | dem %s", list(rec.Demoted))
		}
		if len(rec.Deferred) > 0 {
			fmt.Fprintf(&b, " | defer %s", list(rec.Deferred))
		}
		if rec.CostUsed > 0 {
			fmt.Fprintf(&b, " | cost %d", rec.CostUsed)
		}
		if len(rec.Finished) > 0 {
			fmt.Fprintf(&b, " | done %s", list(rec.Finished))
		}
		if h.kvPages() {
			fmt.Fprintf(&b, " | avail %d", h.kv.Available())
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (h *story) kvPages() bool { return h.kv.Pages() > 0 }

func (h *story) state() string {
	h.start()
	var b strings.Builder
	for _, r := range h.sim.Active {
		kv := "none"
		switch {
		case h.kv.IsActive(r.ID):
			kv = "active"
		case h.kv.HasCache(r.ID):
			kv = "suspended"
		}
		fmt.Fprintf(&b, "%d %s %d/%d gen %d/%d kv %s\n", r.ID, r.State, r.ContextPosition, r.PromptLen, r.Generated, r.MaxNewTokens, kv)
	}
	if b.Len() == 0 {
		return "(no active requests)"
	}
	return b.String()
}
