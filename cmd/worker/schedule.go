package main

// `worker schedule --scenario FILE.json`: a dry run of the scheduler on one
// rank (docs/schedule-dry-run.md). It builds a real kvpool of the scenario's
// size, materialises each request's existing KV, runs the iterations with
// scheduler/sim (the executor's non-overlap apply rules) and prints one JSON
// line per iteration.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/scheduler/sim"
)

// Defaults of the scenario config for the settings the spec leaves required
// (the scheduler spec's test-harness values, §18.1).
const (
	dryRunMaxBatchSize  = 100
	dryRunMaxNumTokens  = 1024
	dryRunTokensPerPage = 64
	// dryRunMaxIterations bounds "run until done" (iterations omitted or 0).
	dryRunMaxIterations = 1_000_000
)

// scenarioConfig is the scenario's "config" block; its keys are fixed by the
// dry-run format, whatever the YAML config calls the same settings.
type scenarioConfig struct {
	MaxNumTokens json.RawMessage `json:"max_num_tokens"` // null = unlimited
	MaxBatchSize *int            `json:"max_batch_size"`
	Chunking     struct {
		Enabled bool `json:"enabled"`
		Unit    int  `json:"unit"`
	} `json:"chunking"`
	Policy    string `json:"policy"`
	EqualCost struct {
		KVCostOffset        int64 `json:"kv_cost_offset"`
		KVDepthThreshold    int64 `json:"kv_depth_threshold"`
		PerChunkDepthTokens int64 `json:"per_chunk_depth_tokens"`
	} `json:"equal_cost"`
	Demotion struct {
		UncachedTokens int64 `json:"uncached_tokens"`
		MaxIters       int64 `json:"max_iters"`
	} `json:"demotion"`
	KV struct {
		Pages         int `json:"pages"`
		TokensPerPage int `json:"tokens_per_page"`
		HostPages     int `json:"host_pages"`
	} `json:"kv"`
}

// scenarioRequest is one entry of "requests".
type scenarioRequest struct {
	ID               uint64 `json:"id"`
	Arrive           int    `json:"arrive"`
	PromptLen        int    `json:"prompt_len"`
	Position         int    `json:"position"`
	MaxNewTokens     int    `json:"max_new_tokens"`
	Generated        int    `json:"generated"`
	UncachedEstimate *int64 `json:"uncached_estimate"`
	ConversationID   string `json:"conversation_id"`
	InFlight         bool   `json:"in_flight"`
}

// scenario is a parsed scenario file.
type scenario struct {
	cfg        scheduler.Config
	pool       kvpool.Config
	specs      []sim.Spec
	iterations int
}

// runSchedule is the `schedule` subcommand.
func runSchedule(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("scenario", "", "scenario file (JSON; see docs/schedule-dry-run.md)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		return usageError{errors.New("--scenario FILE.json is required (and no other arguments)")}
	}
	raw, err := os.ReadFile(*path)
	if err != nil {
		return err
	}
	sc, err := parseScenario(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	return dryRun(sc, stdout, stderr)
}

// dryRun executes a parsed scenario, one JSON line per iteration on stdout;
// the scheduler's startup line and notes go to stderr.
func dryRun(sc *scenario, stdout, stderr io.Writer) error {
	pool, err := kvpool.New(sc.pool)
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	defer pool.Close()
	s, err := scheduler.New(sc.cfg, pool)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	fmt.Fprintln(stderr, s.Describe())
	sm, err := sim.New(s, &dryRunPool{Manager: pool, policy: sc.cfg.Policy}, sc.specs)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	n := sc.iterations
	for i := 0; n == 0 || i < n; i++ {
		if n == 0 && (sm.Done() || i == dryRunMaxIterations) {
			break
		}
		rec, out, err := sm.Step()
		if err != nil {
			return err
		}
		// No engine here: the page copies of suspensions and resumes are
		// bookkeeping only, drained like the executor drains them.
		pool.TakeCopies()
		for _, note := range out.Notes {
			fmt.Fprintf(stderr, "iteration %d: %s: %s\n", rec.Iteration, note.Level, note.Text)
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return nil
}

// dryRunPool adapts kvpool.Manager to sim.Pool.
type dryRunPool struct {
	*kvpool.Manager
	policy scheduler.Policy
}

// Materialize creates r's cache holding its existing KV: ContextPosition
// prompt tokens, plus Generated−1 generated tokens. Under
// GUARANTEED_NO_EVICT the request is admitted with a reservation to
// completion, as it would have been when its first chunk ran.
func (p *dryRunPool) Materialize(r *scheduler.Request) error {
	extra := 0
	if r.Generated > 0 {
		extra = r.Generated - 1
	}
	if !p.PrepareContext(r) {
		return errors.New("no page-table row")
	}
	ok := false
	if p.policy == scheduler.GuaranteedNoEvict {
		ok = p.PrepareBlocksIfSchedulable(r, extra)
	} else {
		ok = p.ResizeContext(r, extra)
	}
	if !ok {
		p.Free(r)
		return fmt.Errorf("%d tokens do not fit the free pages", r.ContextPosition+extra)
	}
	p.UpdateAfterContext(r)
	if r.Generated > 0 {
		p.UpdateAfterGeneration(r)
	}
	return nil
}

// AfterContext commits a chunk (the position has advanced past it).
func (p *dryRunPool) AfterContext(r *scheduler.Request) error {
	p.UpdateAfterContext(r)
	return nil
}

// AfterGeneration records the generation step.
func (p *dryRunPool) AfterGeneration(r *scheduler.Request) error {
	p.UpdateAfterGeneration(r)
	return nil
}

// parseScenario decodes and validates a scenario file. Errors name the
// request id and field, or the config key.
func parseScenario(raw []byte) (*scenario, error) {
	var top struct {
		Config     json.RawMessage   `json:"config"`
		Requests   []json.RawMessage `json:"requests"`
		Iterations *int              `json:"iterations"`
	}
	if err := strictDecode(raw, &top); err != nil {
		return nil, err
	}
	sc := &scenario{}
	if top.Iterations != nil {
		if *top.Iterations < 0 {
			return nil, fmt.Errorf("iterations: %d is negative", *top.Iterations)
		}
		sc.iterations = *top.Iterations
	}
	for i, rr := range top.Requests {
		sp, err := parseRequest(i, rr)
		if err != nil {
			return nil, err
		}
		sc.specs = append(sc.specs, sp)
	}
	if err := sc.parseConfig(top.Config); err != nil {
		return nil, err
	}
	return sc, sc.checkArrivals()
}

// strictDecode decodes one JSON value, rejecting unknown keys and trailing data.
func strictDecode(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// parseRequest decodes requests[i]; errors name the id (or the index when
// the id itself is wrong) and the field.
func parseRequest(i int, raw json.RawMessage) (sim.Spec, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return sim.Spec{}, fmt.Errorf("requests[%d]: %w", i, err)
	}
	var id uint64
	if err := json.Unmarshal(fields["id"], &id); err != nil || fields["id"] == nil {
		return sim.Spec{}, fmt.Errorf("requests[%d]: id: missing or not a non-negative integer", i)
	}
	var r scenarioRequest
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad field reported is deterministic
	for _, k := range keys {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		if err := strictDecode(one, &r); err != nil {
			return sim.Spec{}, fmt.Errorf("request %d: %s: %v", id, k, jsonReason(err))
		}
	}
	sp := sim.Spec{ID: r.ID, Arrive: r.Arrive, PromptLen: r.PromptLen, Position: r.Position,
		MaxNewTokens: r.MaxNewTokens, Generated: r.Generated, UncachedEstimate: scheduler.UnsetEstimate,
		ConversationID: r.ConversationID, InFlight: r.InFlight}
	if r.UncachedEstimate != nil {
		if *r.UncachedEstimate < 0 {
			return sp, fmt.Errorf("request %d: uncached_estimate: %d is negative", id, *r.UncachedEstimate)
		}
		sp.UncachedEstimate = *r.UncachedEstimate
	}
	return sp, nil
}

// jsonReason shortens encoding/json errors to what a user acts on.
func jsonReason(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("got a JSON %s, want %s", te.Value, te.Type)
	}
	return err.Error()
}

// parseConfig fills the scheduler and pool configs from the config block.
func (sc *scenario) parseConfig(raw json.RawMessage) error {
	var c scenarioConfig
	if len(raw) > 0 {
		if err := strictDecode(raw, &c); err != nil {
			return fmt.Errorf("config: %v", jsonReason(err))
		}
	}
	cfg := scheduler.DefaultConfig()
	cfg.MaxBatchSize = dryRunMaxBatchSize
	if c.MaxBatchSize != nil {
		cfg.MaxBatchSize = *c.MaxBatchSize
	}
	cfg.MaxNumTokens = dryRunMaxNumTokens
	switch string(bytes.TrimSpace(c.MaxNumTokens)) {
	case "":
	case "null":
		cfg.MaxNumTokens = scheduler.Unlimited
	default:
		if err := json.Unmarshal(c.MaxNumTokens, &cfg.MaxNumTokens); err != nil || cfg.MaxNumTokens < 0 {
			return fmt.Errorf("config: max_num_tokens: %s, want a non-negative integer or null (unlimited)", c.MaxNumTokens)
		}
	}
	if c.Policy != "" {
		p, err := scheduler.ParsePolicy(c.Policy)
		if err != nil {
			return fmt.Errorf("config: policy: %q, want max_utilization or guaranteed_no_evict", c.Policy)
		}
		cfg.Policy = p
	}
	page := dryRunTokensPerPage
	if c.KV.TokensPerPage != 0 {
		page = c.KV.TokensPerPage
	}
	if page < 1 {
		return fmt.Errorf("config: kv.tokens_per_page: %d, want ≥ 1", page)
	}
	cfg.LedgerBlockTokens = page
	cfg.ChunkedContext, cfg.ChunkUnitSize = c.Chunking.Enabled, c.Chunking.Unit
	cfg.EqualCost = scheduler.EqualCost{KVOffset: c.EqualCost.KVCostOffset,
		KVDepthThreshold: c.EqualCost.KVDepthThreshold, PerChunkDepthTokens: c.EqualCost.PerChunkDepthTokens}
	cfg.Demotion = scheduler.Demotion{UncachedTokens: c.Demotion.UncachedTokens, MaxIters: c.Demotion.MaxIters}
	if _, err := scheduler.New(cfg, nopKV{}); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	sc.cfg = cfg

	pages := c.KV.Pages
	if pages == 0 { // never short: every request to completion at once
		for _, sp := range sc.specs {
			pages += (sp.PromptLen + sp.MaxNewTokens + page - 1) / page
		}
		pages = max(pages, 1)
	}
	if pages < 0 {
		return fmt.Errorf("config: kv.pages: %d, want ≥ 1 (or 0/omitted for a pool that never runs short)", pages)
	}
	if c.KV.HostPages < 0 {
		return fmt.Errorf("config: kv.host_pages: %d, want ≥ 0 (0 = no host tier)", c.KV.HostPages)
	}
	sc.pool = kvpool.Config{NumPages: pages, TokensPerPage: page, HostPages: c.KV.HostPages}
	return nil
}

// checkArrivals applies the executor's arrival rejections (spec §1): a
// prompt longer than M without chunking, and under GUARANTEED_NO_EVICT a
// request that needs more pages than the whole pool.
func (sc *scenario) checkArrivals() error {
	for _, sp := range sc.specs {
		if !sc.cfg.ChunkedContext && sc.cfg.MaxNumTokens != scheduler.Unlimited && sp.PromptLen-sp.Position > sc.cfg.MaxNumTokens {
			return fmt.Errorf("request %d: prompt_len: %d tokens left to prefill exceed max_num_tokens %d with chunking disabled "+
				"(the executor rejects it on arrival)", sp.ID, sp.PromptLen-sp.Position, sc.cfg.MaxNumTokens)
		}
		if sc.cfg.Policy == scheduler.GuaranteedNoEvict {
			r := &scheduler.Request{PromptLen: sp.PromptLen, MaxNewTokens: sp.MaxNewTokens}
			if need := scheduler.PagesToCompletion(r, sc.pool.TokensPerPage); need > sc.pool.NumPages {
				return fmt.Errorf("request %d: max_new_tokens: needs %d pages to completion, more than kv.pages %d "+
					"(GUARANTEED_NO_EVICT rejects it on arrival)", sp.ID, need, sc.pool.NumPages)
			}
		}
	}
	return nil
}

// nopKV lets parseConfig validate the scheduler config before the pool exists.
type nopKV struct{}

func (nopKV) PrepareContext(*scheduler.Request) bool                  { return false }
func (nopKV) ResizeContext(*scheduler.Request, int) bool              { return false }
func (nopKV) PrepareBlocksIfSchedulable(*scheduler.Request, int) bool { return false }
func (nopKV) ReleaseContextAdmission(*scheduler.Request)              {}
func (nopKV) TryAllocateGeneration(*scheduler.Request) bool           { return false }
func (nopKV) RevertAllocateGeneration(*scheduler.Request)             {}
func (nopKV) Suspend(*scheduler.Request)                              {}
func (nopKV) Free(*scheduler.Request)                                 {}
func (nopKV) IsActive(uint64) bool                                    { return false }
func (nopKV) HasCache(uint64) bool                                    { return false }
func (nopKV) HasHostTier() bool                                       { return false }
func (nopKV) HoldsDevicePages(uint64) bool                            { return false }
func (nopKV) BlockReuseEnabled() bool                                 { return false }
func (nopKV) ReusePolicy() scheduler.ReusePolicy                      { return scheduler.PerRequest }
func (nopKV) ProbeFirstNewBlockKey(*scheduler.Request) (scheduler.BlockKey, bool) {
	return scheduler.BlockKey{}, false
}
