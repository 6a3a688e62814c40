// Package scenario reads the dry-run scenario files of `worker schedule`
// (docs/schedule-dry-run.md) and runs them: a real kvpool of the
// scenario's size, each request's existing KV materialised, the iterations
// run with scheduler/sim (the executor's non-overlap apply rules), one JSON
// line per iteration. Unlike scheduler/sim it is not pure: it decodes JSON
// and writes the records.
package scenario

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"

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
)

// MaxIterations bounds every dry run: "iterations" may not ask for more,
// and a run until done that reaches it with requests unfinished is an error
// naming them. A variable so that tests can lower it.
var MaxIterations = 1_000_000

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

// Scenario is a parsed scenario file.
type Scenario struct {
	cfg        scheduler.Config
	pool       kvpool.Config
	specs      []sim.Spec
	iterations int
}

// Run executes a parsed scenario, one JSON line per iteration on stdout;
// the scheduler's startup line and notes go to stderr.
func Run(sc *Scenario, stdout, stderr io.Writer) error {
	pool, err := kvpool.New(sc.pool)
	if err != nil {
		return fmt.Errorf("config.kv: %w", err)
	}
	defer pool.Close()
	s, err := scheduler.New(sc.cfg, pool)
	if err != nil {
		return err // names the scenario's keys (scenarioNames)
	}
	fmt.Fprintln(stderr, s.Describe())
	sm, err := sim.New(s, &dryRunPool{Manager: pool, policy: sc.cfg.Policy}, sc.specs)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	n := sc.iterations
	for i := 0; n == 0 || i < n; i++ {
		if n == 0 && sm.Done() {
			break
		}
		if n == 0 && i == MaxIterations {
			return unfinishedError(sm.Unfinished())
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

// unfinishedError reports a run until done that reached the iteration
// limit, naming the unfinished requests (the first 20).
func unfinishedError(ids []uint64) error {
	names := make([]string, 0, min(len(ids), 21))
	for i, id := range ids {
		if i == 20 {
			names = append(names, "…")
			break
		}
		names = append(names, strconv.FormatUint(id, 10))
	}
	plural := "s"
	if len(ids) == 1 {
		plural = ""
	}
	return fmt.Errorf("reached the dry run's limit of %d iterations with %d request%s unfinished: %s "+
		"(set \"iterations\" to look at the first ones)", MaxIterations, len(ids), plural, strings.Join(names, ", "))
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

// Parse decodes and validates a scenario file. Errors name the request id
// and field, or the config key.
func Parse(raw []byte) (*Scenario, error) {
	var top struct {
		Config     json.RawMessage   `json:"config"`
		Requests   []json.RawMessage `json:"requests"`
		Iterations *int              `json:"iterations"`
	}
	if err := strictDecode(raw, &top); err != nil {
		field, reason := jsonReason(err)
		if field == "" {
			field = "the scenario"
		}
		return nil, fmt.Errorf("%s: %s", field, reason)
	}
	sc := &Scenario{}
	if top.Iterations != nil {
		switch n := *top.Iterations; {
		case n < 0:
			return nil, fmt.Errorf("iterations: %d is negative", n)
		case n > MaxIterations:
			return nil, fmt.Errorf("iterations: %d is beyond the dry run's limit of %d iterations", n, MaxIterations)
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
	if err := sim.Validate(sc.specs); err != nil {
		return nil, err
	}
	if err := sc.parseConfig(top.Config); err != nil {
		return nil, err
	}
	if err := sc.checkArrivals(); err != nil {
		return nil, err
	}
	return sc, sc.checkLimit()
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
		_, reason := jsonReason(err)
		return sim.Spec{}, fmt.Errorf("requests[%d]: %s", i, reason)
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
			_, reason := jsonReason(err)
			return sim.Spec{}, fmt.Errorf("request %d: %s: %s", id, k, reason)
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

// jsonReason turns an encoding/json error into what a user acts on, in JSON
// terms (never a Go type): the dotted field it is about ("" for none or
// unknown) and the reason.
func jsonReason(err error) (field, reason string) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field, fmt.Sprintf("got a JSON %s, want %s", te.Value, jsonWant(te.Type))
	}
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "", "unexpected end of JSON input"
	case errors.Is(err, io.EOF):
		return "", "no JSON value (the file is empty); want an object"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "", fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	}
	return "", strings.TrimPrefix(err.Error(), "json: ")
}

// jsonWant names the JSON value a Go type decodes from.
func jsonWant(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return jsonWant(t.Elem())
	}
	return "another JSON value"
}

// parseConfig fills the scheduler and pool configs from the config block.
func (sc *Scenario) parseConfig(raw json.RawMessage) error {
	var c scenarioConfig
	if len(raw) > 0 {
		if err := strictDecode(raw, &c); err != nil {
			field, reason := jsonReason(err)
			if field != "" {
				return fmt.Errorf("config: %s: %s", field, reason)
			}
			return fmt.Errorf("config: %s", reason)
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
	cfg.Names = scenarioNames(c.Chunking.Unit != 0)
	if _, err := scheduler.New(cfg, nopKV{}); err != nil {
		return err
	}
	if len(sc.specs) > 0 {
		if err := cfg.CheckServable(); err != nil {
			return err
		}
	}
	sc.cfg = cfg
	return sc.parsePool(&c, page)
}

// parsePool fills the pool config from the config block's kv section (page
// is the page size, already checked).
func (sc *Scenario) parsePool(c *scenarioConfig, page int) error {
	pages := c.KV.Pages
	switch {
	case pages < 0:
		return fmt.Errorf("config: kv.pages: %d, want ≥ 1 (or 0/omitted for a pool that never runs short)", pages)
	case pages > kvpool.MaxPages:
		return fmt.Errorf("config: kv.pages: %d, want at most %d (int32 page indices)", pages, kvpool.MaxPages)
	case pages == 0: // never short: every request to completion at once
		total := uint64(0)
		for _, sp := range sc.specs { // each term < 2^63; stop before the sum can wrap
			total += (uint64(sp.PromptLen) + uint64(sp.MaxNewTokens) + uint64(page) - 1) / uint64(page)
			if total > kvpool.MaxPages {
				return fmt.Errorf("config: kv.pages: omitted, and a pool holding every request to completion at once "+
					"needs more than %d pages (int32 page indices); set kv.pages", kvpool.MaxPages)
			}
		}
		pages = max(int(total), 1)
	}
	switch h := c.KV.HostPages; {
	case h < 0:
		return fmt.Errorf("config: kv.host_pages: %d, want ≥ 0 (0 = no host tier)", h)
	case h > kvpool.MaxPages:
		return fmt.Errorf("config: kv.host_pages: %d, want at most %d (int32 page indices)", h, kvpool.MaxPages)
	}
	sc.pool = kvpool.Config{NumPages: pages, TokensPerPage: page, HostPages: c.KV.HostPages}
	return nil
}

// checkArrivals applies the executor's arrival rejections (spec §1) with
// the scheduler's admission rules (scheduler.Admission): a prompt whose
// tokens left to prefill exceed M without chunking, and under
// GUARANTEED_NO_EVICT a request that needs more pages than the whole pool.
// The dry run's messages name the scenario's fields.
func (sc *Scenario) checkArrivals() error {
	adm := scheduler.Admission{Pages: sc.pool.NumPages, LedgerBlockTokens: sc.pool.TokensPerPage, Scheduler: sc.cfg}
	for _, sp := range sc.specs {
		if left := sp.PromptLen - sp.Position; !sc.cfg.CanPrefill(left) {
			return fmt.Errorf("request %d: prompt_len: %d tokens left to prefill exceed max_num_tokens %d with chunking disabled "+
				"(the executor rejects it on arrival)", sp.ID, left, sc.cfg.MaxNumTokens)
		}
		if need, ok := adm.ReservationFits(sp.PromptLen, sp.MaxNewTokens); !ok {
			return fmt.Errorf("request %d: max_new_tokens: needs %d pages to completion, more than kv.pages %d "+
				"(GUARANTEED_NO_EVICT rejects it on arrival)", sp.ID, need, sc.pool.NumPages)
		}
	}
	return nil
}

// scenarioNames are the scenario's keys for the scheduler's settings, so
// that its errors name them (never a TLLM_* variable, which the dry run
// does not read). unitSet: the config gives chunking.unit.
func scenarioNames(unitSet bool) scheduler.SettingNames {
	var n scheduler.SettingNames
	n[scheduler.SettingMaxBatchSize] = "config.max_batch_size"
	n[scheduler.SettingMaxNumTokens] = "config.max_num_tokens"
	n[scheduler.SettingChunkedContext] = "config.chunking.enabled"
	n[scheduler.SettingChunkUnitSize] = "config.chunking.unit"
	if !unitSet {
		n[scheduler.SettingChunkUnitSize] = "config.kv.tokens_per_page (the chunk unit while config.chunking.unit is 0)"
	}
	n[scheduler.SettingPolicy] = "config.policy"
	n[scheduler.SettingRecomputePause] = "recompute pause (always on in the dry run)"
	n[scheduler.SettingSchedulerCapacity] = "scheduler_capacity (not set by a scenario)"
	n[scheduler.SettingKVCostOffset] = "config.equal_cost.kv_cost_offset"
	n[scheduler.SettingKVDepthThreshold] = "config.equal_cost.kv_depth_threshold"
	n[scheduler.SettingPerChunkDepthTokens] = "config.equal_cost.per_chunk_depth_tokens"
	n[scheduler.SettingDemoteUncachedTokens] = "config.demotion.uncached_tokens"
	n[scheduler.SettingDemoteMaxIters] = "config.demotion.max_iters"
	n[scheduler.SettingPoolSize] = "config.kv.pages and config.kv.tokens_per_page"
	return n
}

// checkLimit refuses requests that could never finish within the dry run's
// iteration limit: an arrival at or beyond it, and, when the run goes until
// done, a request whose fewest possible iterations exceed it. The fewest
// iterations are its arrival, one pass per chunk of at most
// max_num_tokens (one pass without chunking), and one per token still to
// generate after the one the last chunk samples.
func (sc *Scenario) checkLimit() error {
	limit := int64(MaxIterations)
	for _, sp := range sc.specs {
		if int64(sp.Arrive) >= limit {
			return fmt.Errorf("request %d: arrive: %d is beyond the dry run's limit of %d iterations", sp.ID, sp.Arrive, limit)
		}
		if sc.iterations > 0 {
			continue // a bounded look: unfinished requests are expected
		}
		var prefill, decode int64
		if rest := int64(sp.PromptLen - sp.Position); rest > 0 {
			prefill = 1
			if m := int64(sc.cfg.MaxNumTokens); sc.cfg.ChunkedContext && sc.cfg.MaxNumTokens != scheduler.Unlimited && m > 0 {
				prefill = (rest + m - 1) / m
			}
			decode = int64(sp.MaxNewTokens) - 1
		} else {
			decode = int64(sp.MaxNewTokens - sp.Generated)
		}
		if need := int64(sp.Arrive) + prefill + decode; need > limit {
			return fmt.Errorf("request %d: max_new_tokens: %d tokens need at least %d iterations, beyond the dry run's "+
				"limit of %d (set \"iterations\" to look at the first ones)", sp.ID, sp.MaxNewTokens, need, limit)
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

// FirstChunkBlocked never promises a failure: every first chunk is tried.
func (nopKV) FirstChunkBlocked(*scheduler.Request, func(*scheduler.Request, int) int) bool {
	return false
}

// NoFirstChunkFits never promises a failure.
func (nopKV) NoFirstChunkFits() bool { return false }
