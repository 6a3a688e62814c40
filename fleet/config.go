package fleet

// The YAML configuration file of `worker run` (--config, docs/config.md).
//
// The file is read into a yaml.Node and walked against a fixed table of
// keys instead of being decoded into a struct, because struct decoding is
// lenient in ways that hide mistakes (yaml.v3 truncates 1.5 into an int,
// reads 017 as octal, ignores documents after the first and duplicate keys)
// and cannot say on which line a value was set. Every value therefore keeps
// its origin ("FILE:LINE key"), and later errors about it name that origin
// instead of the flag it stands in for.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"go.yaml.in/yaml/v3"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// valueKind is the type a config key accepts.
type valueKind int

const (
	kindInt    valueKind = iota // base-10 integer that fits an int64
	kindUint64                  // base-10 non-negative integer that fits a uint64
	kindBool                    // true or false
	kindString                  // a YAML string (quote numbers: "8")
	kindFloat                   // finite number
)

// want says what a kind accepts, for errors.
func (k valueKind) want() string {
	switch k {
	case kindInt:
		return "a base-10 integer"
	case kindUint64:
		return "a non-negative base-10 integer"
	case kindBool:
		return "true or false"
	case kindString:
		return "a string"
	default:
		return "a finite number"
	}
}

// fileValue is one parsed scalar; the field of the key's kind is set.
type fileValue struct {
	i int64
	u uint64
	b bool
	s string
	f float64
}

// fileKey is one setting of the config file.
type fileKey struct {
	path string // dotted: "scheduler.max_num_tokens"
	kind valueKind
	// flag is the command-line flag for the same option: given on the
	// command line it wins over the file. "" for file-only settings.
	flag string
	// setting is the scheduler setting a file-only key configures, so that
	// scheduler errors name the key (-1 for none).
	setting scheduler.Setting
	set     func(o *Options, v fileValue)
}

// fileKeys are every key of the file, in the order of docs/config.md.
var fileKeys = []fileKey{
	{path: "engine", kind: kindString, flag: "engine", set: func(o *Options, v fileValue) { o.Engine = v.s }},
	{path: "model", kind: kindString, flag: "model", set: func(o *Options, v fileValue) { o.Model = v.s }},
	{path: "seed", kind: kindUint64, flag: "seed", set: func(o *Options, v fileValue) { o.Seed = v.u }},
	{path: "ranks", kind: kindInt, flag: "ranks", set: func(o *Options, v fileValue) { o.Ranks = int(v.i) }},
	{path: "cp", kind: kindInt, flag: "cp", set: func(o *Options, v fileValue) { o.CP = int(v.i) }},
	{path: "cpu_threads", kind: kindInt, flag: "cpu-threads", set: func(o *Options, v fileValue) { o.CPUThreads = int(v.i) }},
	{path: "cpu_kernels", kind: kindString, flag: "cpu-kernels", set: func(o *Options, v fileValue) { o.CPUKernels = v.s }},
	{path: "router", kind: kindString, flag: "router", set: func(o *Options, v fileValue) { o.Router = v.s }},
	{path: "overlap", kind: kindString, flag: "overlap", set: func(o *Options, v fileValue) { o.Overlap = v.s }},
	{path: "kv.pages", kind: kindInt, flag: "pages", set: func(o *Options, v fileValue) { o.Pages = int(v.i) }},
	{path: "kv.tokens_per_page", kind: kindInt, flag: "tokens-per-page", set: func(o *Options, v fileValue) { o.TokensPerPage = int(v.i) }},
	{path: "kv.host_pages", kind: kindInt, flag: "host-pages", set: func(o *Options, v fileValue) { o.HostPages = int(v.i) }},
	{path: "kv.enable_block_reuse", kind: kindBool, flag: "no-prefix-reuse", set: func(o *Options, v fileValue) { o.NoPrefixReuse = !v.b }},
	{path: "kv.event_buffer_max_size", kind: kindInt, flag: "event-buffer-max-size", set: func(o *Options, v fileValue) { o.EventBufferMaxSize = int(v.i) }},
	{path: "kv.max_seq_len", kind: kindInt, flag: "max-seq-len", set: func(o *Options, v fileValue) { o.MaxSeqLen = int(v.i) }},
	{path: "kv_events_config.enable_kv_cache_events", kind: kindBool, setting: -1,
		set: func(o *Options, v fileValue) { o.KVEventsConfig.EnableKVCacheEvents = v.b }},
	{path: "kv_events_config.publisher", kind: kindString, setting: -1, set: func(o *Options, v fileValue) { o.KVEventsConfig.Publisher = v.s }},
	{path: "kv_events_config.endpoint", kind: kindString, flag: "kv-events-endpoint",
		set: func(o *Options, v fileValue) { o.KVEventsConfig.Endpoint = v.s }},
	{path: "kv_events_config.replay_endpoint", kind: kindString, flag: "kv-events-replay-endpoint",
		set: func(o *Options, v fileValue) { o.KVEventsConfig.ReplayEndpoint = v.s }},
	{path: "kv_events_config.topic", kind: kindString, flag: "kv-events-topic", set: func(o *Options, v fileValue) { o.KVEventsConfig.Topic = v.s }},
	{path: "kv_events_config.buffer_steps", kind: kindInt, setting: -1, set: func(o *Options, v fileValue) { o.KVEventsConfig.BufferSteps = int(v.i) }},
	{path: "kv_events_config.hwm", kind: kindInt, setting: -1, set: func(o *Options, v fileValue) { o.KVEventsConfig.HWM = int(v.i) }},
	{path: "kv_events_config.encoding", kind: kindString, setting: -1, set: func(o *Options, v fileValue) { o.KVEventsConfig.Encoding = v.s }},
	{path: "scheduler.max_batch_size", kind: kindInt, flag: "max-batch-size", set: func(o *Options, v fileValue) { o.Scheduler.MaxBatchSize = int(v.i) }},
	{path: "scheduler.scheduler_capacity", kind: kindInt, setting: scheduler.SettingSchedulerCapacity,
		set: func(o *Options, v fileValue) { o.Scheduler.SchedulerCapacity = int(v.i) }},
	{path: "scheduler.max_num_tokens", kind: kindInt, flag: "max-num-tokens", set: func(o *Options, v fileValue) { o.Scheduler.MaxNumTokens = int(v.i) }},
	{path: "scheduler.enable_chunked_context", kind: kindBool, flag: "chunked-prefill", set: func(o *Options, v fileValue) { o.Scheduler.ChunkedContext = v.b }},
	{path: "scheduler.chunk_unit_size", kind: kindInt, flag: "chunk-unit", set: func(o *Options, v fileValue) { o.Scheduler.ChunkUnitSize = int(v.i) }},
	{path: "scheduler.capacity_policy", kind: kindString, flag: "policy", set: func(o *Options, v fileValue) { o.SetPolicy(v.s) }},
	{path: "scheduler.admission_lookahead_iterations", kind: kindInt, flag: "admission-lookahead",
		set: func(o *Options, v fileValue) { o.Scheduler.AdmissionLookahead = int(v.i) }},
	{path: "scheduler.enable_recompute_pause", kind: kindBool, setting: scheduler.SettingRecomputePause,
		set: func(o *Options, v fileValue) { o.Scheduler.RecomputePause = v.b }},
	{path: "scheduler.enable_prefix_aware_scheduling", kind: kindBool, setting: -1,
		set: func(o *Options, v fileValue) { o.Scheduler.PrefixAware = v.b }},
	{path: "scheduler.equal_cost.kv_cost_offset", kind: kindInt, setting: scheduler.SettingKVCostOffset,
		set: func(o *Options, v fileValue) { o.Scheduler.EqualCost.KVOffset = v.i }},
	{path: "scheduler.equal_cost.kv_depth_threshold", kind: kindInt, setting: scheduler.SettingKVDepthThreshold,
		set: func(o *Options, v fileValue) { o.Scheduler.EqualCost.KVDepthThreshold = v.i }},
	{path: "scheduler.equal_cost.per_chunk_depth_tokens", kind: kindInt, setting: scheduler.SettingPerChunkDepthTokens,
		set: func(o *Options, v fileValue) { o.Scheduler.EqualCost.PerChunkDepthTokens = v.i }},
	{path: "scheduler.demotion.uncached_tokens", kind: kindInt, setting: scheduler.SettingDemoteUncachedTokens,
		set: func(o *Options, v fileValue) { o.Scheduler.Demotion.UncachedTokens = v.i }},
	{path: "scheduler.demotion.max_iters", kind: kindInt, setting: scheduler.SettingDemoteMaxIters,
		set: func(o *Options, v fileValue) { o.Scheduler.Demotion.MaxIters = v.i }},
	{path: "scheduler.ctx_cost.mode", kind: kindString, flag: "ctx-cost", set: func(o *Options, v fileValue) { o.SetCostMode(v.s) }},
	{path: "scheduler.ctx_cost.percentile", setting: -1, kind: kindFloat, set: func(o *Options, v fileValue) { o.Calibration.Percentile = v.f }},
	{path: "scheduler.ctx_cost.min_samples", setting: -1, kind: kindInt, set: func(o *Options, v fileValue) { o.Calibration.MinSamples = int(v.i) }},
	{path: "scheduler.ctx_cost.window", setting: -1, kind: kindInt, set: func(o *Options, v fileValue) { o.Calibration.Window = int(v.i) }},
	{path: "scheduler.ctx_cost.refresh_interval", setting: -1, kind: kindInt, set: func(o *Options, v fileValue) { o.Calibration.RefreshInterval = int(v.i) }},
	{path: "scheduler.ctx_cost.hysteresis", setting: -1, kind: kindFloat, set: func(o *Options, v fileValue) { o.Calibration.Hysteresis = v.f }},
	{path: "scheduler.ctx_cost.lockstep_correction", setting: -1, kind: kindBool, set: func(o *Options, v fileValue) { o.Calibration.LockstepCorrection = v.b }},
	{path: "conversation_router.new_conv_placement", kind: kindString, flag: "new-conv-placement",
		set: func(o *Options, v fileValue) { o.NewConvPlacement = v.s }},
	{path: "conversation_router.load_balance_weight", kind: kindFloat, flag: "load-balance-weight",
		set: func(o *Options, v fileValue) { o.LoadBalanceWeight = v.f }},
	{path: "attention_dp_config.enable_balance", kind: kindBool, flag: "attention-dp-balance",
		set: func(o *Options, v fileValue) { o.ADPBalance.Enable = v.b }},
	{path: "attention_dp_config.enable_cost_leveling", kind: kindBool, flag: "attention-dp-cost-leveling",
		set: func(o *Options, v fileValue) { o.ADPBalance.CostLeveling = v.b }},
	{path: "attention_dp_config.timeout_iters", kind: kindInt, flag: "attention-dp-timeout-iters",
		set: func(o *Options, v fileValue) { o.ADPBalance.TimeoutIters = int(v.i) }},
	{path: "attention_dp_config.batching_wait_iters", kind: kindInt, flag: "attention-dp-batching-wait-iters",
		set: func(o *Options, v fileValue) { o.ADPBalance.BatchingWaitIters = int(v.i) }},
	{path: "twin.gpu", kind: kindString, flag: "gpu", set: func(o *Options, v fileValue) { o.GPU = v.s }},
	{path: "twin.cost_profile", kind: kindString, flag: "cost-profile", set: func(o *Options, v fileValue) { o.CostProfile = v.s }},
	{path: "twin.tp", kind: kindInt, flag: "tp", set: func(o *Options, v fileValue) { o.TP = int(v.i) }},
	{path: "twin.weight_dtype", kind: kindString, flag: "weight-dtype", set: func(o *Options, v fileValue) { o.WeightDType = v.s }},
	{path: "twin.kv_dtype", kind: kindString, flag: "kv-dtype", set: func(o *Options, v fileValue) { o.KVDType = v.s }},
	{path: "twin.gpus_per_node", kind: kindInt, flag: "gpus-per-node", set: func(o *Options, v fileValue) { o.GPUsPerNode = int(v.i) }},
	{path: "twin.host_time", kind: kindString, flag: "twin-host-time", set: func(o *Options, v fileValue) { o.TwinHostTime = v.s }},
	{path: "twin.threads", kind: kindInt, flag: "twin-threads", set: func(o *Options, v fileValue) { o.TwinThreads = int(v.i) }},
	{path: "twin.cuda_graph", kind: kindString, flag: "twin-cuda-graph", set: func(o *Options, v fileValue) { o.TwinCUDAGraph = v.s }},
	{path: "twin.cuda_graph_max_batch_size", kind: kindInt, flag: "twin-cuda-graph-max-batch-size", set: func(o *Options, v fileValue) { o.TwinCUDAGraphMaxBatch = int(v.i) }},
	{path: "twin.moe_dp_padding", kind: kindBool, flag: "twin-moe-dp-padding", set: func(o *Options, v fileValue) { o.TwinMoEPadding = v.b }},
	{path: "twin.expert_zipf", kind: kindFloat, flag: "expert-zipf", set: func(o *Options, v fileValue) { o.ExpertZipf = v.f }},
	{path: "workload.trace", kind: kindString, flag: "trace", set: func(o *Options, v fileValue) { o.Trace = v.s }},
	{path: "workload.limit", kind: kindInt, flag: "limit", set: func(o *Options, v fileValue) { o.Limit = int(v.i) }},
	{path: "workload.length_scale", kind: kindFloat, flag: "length-scale", set: func(o *Options, v fileValue) { o.LengthScale = v.f }},
	{path: "workload.arrival_scale", kind: kindFloat, flag: "arrival-scale", set: func(o *Options, v fileValue) { o.ArrivalScale = v.f }},
	{path: "workload.arrivals", kind: kindString, flag: "arrivals", set: func(o *Options, v fileValue) { o.Arrivals = v.s }},
}

// renamedKeys are keys of earlier versions, refused with their new name
// rather than as unknown (a stale file must not silently lose a setting).
var renamedKeys = map[string]string{
	"scheduler.equal_cost.kv_offset": "scheduler.equal_cost.kv_cost_offset",
}

// fileSetting is one key set in the file.
type fileSetting struct {
	key   *fileKey
	line  int
	value fileValue
}

// fileConfig is a parsed config file: the keys it sets, in file order.
type fileConfig struct {
	path     string
	settings []fileSetting
}

// origin names where s was set: "FILE:LINE key".
func (fc *fileConfig) origin(s fileSetting) string {
	return fmt.Sprintf("%s:%d %s", fc.path, s.line, s.key.path)
}

// loadFileConfig reads and checks a config file. Errors are user-facing
// text naming FILE:LINE and the key.
func loadFileConfig(path string) (*fileConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return parseFileConfig(path, b)
}

// parseFileConfig checks the text of a config file named path (for
// messages): exactly one YAML document whose top level is a mapping of the
// keys of fileKeys, each set once, with a value of its kind. An empty file
// (or one holding only comments) sets nothing.
func parseFileConfig(path string, text []byte) (*fileConfig, error) {
	fc := &fileConfig{path: path}
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return fc, nil
		}
		return nil, fc.syntaxError(err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fc.syntaxError(err)
	default:
		return nil, fmt.Errorf("%s:%d: a second YAML document starts here; the config file must hold exactly one",
			path, docLine(&next))
	}
	if len(doc.Content) == 0 {
		return fc, nil
	}
	if err := fc.walk(doc.Content[0], ""); err != nil {
		return nil, err
	}
	return fc, nil
}

// docLine is the line where a document starts.
func docLine(n *yaml.Node) int {
	if len(n.Content) > 0 && n.Content[0].Line > 0 {
		return n.Content[0].Line
	}
	return max(n.Line, 1)
}

// syntaxError rewrites a yaml.v3 parse error ("yaml: line 3: …") as
// "FILE:3: …".
func (fc *fileConfig) syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return fmt.Errorf("%s:%s: invalid YAML: %s", fc.path, n, after)
			}
		}
	}
	return fmt.Errorf("%s: invalid YAML: %s", fc.path, msg)
}

// resolve follows aliases to the node they name. Anchors are defined before
// their aliases, so the chain ends; the walk visits only the fixed key
// table, so an alias cannot make it loop or blow up.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// isSection reports whether path is a mapping of keys ("" is the top level).
func isSection(path string) bool {
	if path == "" {
		return true
	}
	for i := range fileKeys {
		if strings.HasPrefix(fileKeys[i].path, path+".") {
			return true
		}
	}
	return false
}

// lookupKey returns the key at path, or nil.
func lookupKey(path string) *fileKey {
	for i := range fileKeys {
		if fileKeys[i].path == path {
			return &fileKeys[i]
		}
	}
	return nil
}

// allowedIn lists the names a section accepts, for errors.
func allowedIn(section string) string {
	seen := map[string]bool{}
	var names []string
	prefix := ""
	if section != "" {
		prefix = section + "."
	}
	for _, k := range fileKeys {
		rest, ok := strings.CutPrefix(k.path, prefix)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, ".")
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// join appends a key to a section path.
func join(section, key string) string {
	if section == "" {
		return key
	}
	return section + "." + key
}

// walk checks the mapping n of section and records its settings.
func (fc *fileConfig) walk(n *yaml.Node, section string) error {
	n = resolve(n)
	where := "the top level"
	if section != "" {
		where = section
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil // an empty section ("kv:" with every key commented out)
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: %s: want a mapping of settings (allowed keys: %s), got %s",
			fc.path, n.Line, where, allowedIn(section), describeNode(n))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s:%d: %s: a key must be a plain name, got %s", fc.path, k.Line, where, describeNode(k))
		}
		path := join(section, k.Value)
		if first, dup := seen[k.Value]; dup {
			return fmt.Errorf("%s:%d: %s is set twice (first at line %d)", fc.path, k.Line, path, first)
		}
		seen[k.Value] = k.Line
		if isSection(path) {
			if err := fc.walk(v, path); err != nil {
				return err
			}
			continue
		}
		key := lookupKey(path)
		if key == nil {
			if to, ok := renamedKeys[path]; ok {
				return fmt.Errorf("%s:%d: %s was renamed to %s", fc.path, k.Line, path, to)
			}
			return fmt.Errorf("%s:%d: unknown key %s (allowed in %s: %s)", fc.path, k.Line, strconv.Quote(path),
				where, allowedIn(section))
		}
		val, err := parseScalar(resolve(v), key.kind)
		if err != nil {
			return fmt.Errorf("%s:%d: %s: %v", fc.path, resolve(v).Line, path, err)
		}
		fc.settings = append(fc.settings, fileSetting{key: key, line: k.Line, value: val})
	}
	return nil
}

// parseScalar reads a value of kind from n. Integers are base-10 only (as
// the TLLM_* variables): 1.5, 1e3, 0x10, 017 and "5" are refused, never
// truncated or reinterpreted.
func parseScalar(n *yaml.Node, kind valueKind) (fileValue, error) {
	var v fileValue
	bad := func() (fileValue, error) {
		return v, fmt.Errorf("want %s, got %s", kind.want(), describeNode(n))
	}
	if n.Kind != yaml.ScalarNode {
		return bad()
	}
	tag := n.ShortTag()
	if tag == "!!int" && leadingZero(n.Value) {
		return bad() // 017: octal in YAML 1.1, 17 in base 10; refuse the ambiguity
	}
	switch kind {
	case kindInt:
		if tag != "!!int" {
			return bad()
		}
		i, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			return bad()
		}
		v.i = i
	case kindUint64:
		if tag != "!!int" {
			return bad()
		}
		u, err := strconv.ParseUint(strings.TrimPrefix(n.Value, "+"), 10, 64)
		if err != nil {
			return bad()
		}
		v.u = u
	case kindBool:
		if tag != "!!bool" {
			return bad()
		}
		v.b = strings.EqualFold(n.Value, "true")
	case kindString:
		if tag != "!!str" {
			return bad()
		}
		v.s = n.Value
	case kindFloat:
		if tag != "!!int" && tag != "!!float" {
			return bad()
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return bad()
		}
		v.f = f
	}
	return v, nil
}

// leadingZero reports an integer literal with a leading zero ("017", "-01").
func leadingZero(v string) bool {
	v = strings.TrimLeft(v, "+-")
	return len(v) > 1 && v[0] == '0'
}

// describeNode says what a node holds, in YAML terms, for errors.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	switch n.ShortTag() {
	case "!!null":
		return "nothing (null)"
	case "!!str":
		return "the string " + strconv.Quote(v)
	case "!!int", "!!float", "!!bool":
		return v
	}
	return fmt.Sprintf("%s (tagged %s)", strconv.Quote(v), n.Tag)
}

// mergeConfig applies the config file (if any) under the flags given on the
// command line (set: flag name → given) and records where every value came
// from (Options.src).
func (o *Options) MergeConfig(set map[string]bool) error {
	o.Sources.RanksSet = set["ranks"]
	o.Sources.PagesSet = set["pages"]
	if set["no-prefix-reuse"] && !o.NoPrefixReuse {
		o.Sources.ReuseOnBy = "--no-prefix-reuse=false"
	}
	if o.ConfigPath == "" {
		return nil
	}
	fc, err := loadFileConfig(o.ConfigPath)
	if err != nil {
		return usage.Wrap(err)
	}
	fc.apply(o, set)
	return nil
}

// apply copies every setting of the file into o, unless its flag was given
// on the command line (set[flag]), and records its origin.
func (fc *fileConfig) apply(o *Options, set map[string]bool) {
	for _, s := range fc.settings {
		k := s.key
		if k.path == "ranks" {
			o.Sources.RanksSet = true // an explicit rank count, as if given as a flag
		}
		if k.flag == "pages" {
			o.Sources.PagesSet = true
		}
		if k.flag != "" && set[k.flag] {
			continue
		}
		k.set(o, s.value)
		origin := fc.origin(s)
		if k.flag != "" {
			o.Sources.SetOrigin(k.flag, origin)
		} else if k.setting >= 0 {
			o.Scheduler.Names[k.setting] = origin
		}
		if k.path == "kv.enable_block_reuse" {
			o.Sources.ReuseOnBy = ""
			if s.value.b {
				o.Sources.ReuseOnBy = origin
			}
		}
	}
}

// fileKeyPaths lists every key path, sorted (tests, docs).
func fileKeyPaths() []string {
	out := make([]string, 0, len(fileKeys))
	for _, k := range fileKeys {
		out = append(out, k.path)
	}
	sort.Strings(out)
	return out
}
