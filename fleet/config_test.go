package fleet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/scheduler"
)

// writeConfig writes a YAML config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// requireUserFacing fails when msg shows a Go internal.
func requireUserFacing(t *testing.T, msg string) {
	t.Helper()
	require.Empty(t, usage.Unreadable(msg), "a config error: %s", msg)
}

// TestConfigFileStrict: every value of the file has its kind exactly —
// integers are base-10 integers (1.5, 1e3, 0x10, 017 and "5" are refused,
// never truncated or reinterpreted) — and the file holds one document of
// known keys, each set once. Errors name FILE:LINE and the key.
func TestConfigFileStrict(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"float pages", "kv:\n  pages: 1.5\n", []string{"c.yaml:2: kv.pages: want a base-10 integer, got 1.5"}},
		{"float ranks", "ranks: 2.7\n", []string{"c.yaml:1: ranks: want a base-10 integer, got 2.7"}},
		{"exponent", "kv:\n  pages: 1e3\n", []string{"kv.pages: want a base-10 integer, got 1e3"}},
		{"hex", "kv:\n  pages: 0x10\n", []string{"kv.pages: want a base-10 integer, got 0x10"}},
		{"yaml 1.1 octal", "scheduler:\n  max_num_tokens: 017\n", []string{"c.yaml:2: scheduler.max_num_tokens: want a base-10 integer, got 017"}},
		{"quoted number", "kv:\n  pages: \"5\"\n", []string{`kv.pages: want a base-10 integer, got the string "5"`}},
		{"overflow", "kv:\n  pages: 99999999999999999999\n", []string{"kv.pages: want a base-10 integer"}},
		{"negative seed", "seed: -1\n", []string{"seed: want a non-negative base-10 integer, got -1"}},
		{"null value", "kv:\n  pages:\n", []string{"c.yaml:2: kv.pages: want a base-10 integer, got nothing (null)"}},
		{"bool as yes", "kv:\n  enable_block_reuse: yes\n", []string{`kv.enable_block_reuse: want true or false, got the string "yes"`}},
		{"string as number", "engine: 5\n", []string{"c.yaml:1: engine: want a string, got 5"}},
		{"infinite scale", "workload:\n  length_scale: .inf\n", []string{"workload.length_scale: want a finite number, got .inf"}},
		{"list value", "ranks: [1, 2]\n", []string{"ranks: want a base-10 integer, got a list"}},
		{"second document", "engine: fake\n---\nbogus: 1\nranks: -7\n", []string{"c.yaml:3: a second YAML document starts here; the config file must hold exactly one"}},
		{"empty second document", "engine: fake\n---\n", []string{"a second YAML document"}},
		{"unknown key", "rankz: 3\n", []string{`c.yaml:1: unknown key "rankz" (allowed in the top level: engine, model, seed, ranks, cp, cpu_threads, cpu_kernels, router, overlap, kv, kv_events_config, scheduler, conversation_router, attention_dp_config, twin, workload)`}},
		{"unknown nested key", "kv:\n  pagez: 3\n", []string{`c.yaml:2: unknown key "kv.pagez" (allowed in kv: pages, tokens_per_page`}},
		{"renamed key", "scheduler:\n  equal_cost:\n    kv_offset: 35000\n", []string{"c.yaml:3: scheduler.equal_cost.kv_offset was renamed to scheduler.equal_cost.kv_cost_offset"}},
		{"duplicate key", "ranks: 2\nengine: fake\nranks: 3\n", []string{"c.yaml:3: ranks is set twice (first at line 1)"}},
		{"section not a mapping", "scheduler: 5\n", []string{"c.yaml:1: scheduler: want a mapping of settings (allowed keys: max_batch_size"}},
		{"section is a list", "kv: [1]\n", []string{"c.yaml:1: kv: want a mapping of settings", "got a list"}},
		{"top level list", "- 1\n- 2\n", []string{"c.yaml:1: the top level: want a mapping of settings"}},
		{"top level scalar", "hello\n", []string{`the top level: want a mapping of settings (allowed keys: engine`, `got the string "hello"`}},
		{"complex key", "? [a]\n: 1\n", []string{"c.yaml:1: the top level: a key must be a plain name, got a list"}},
		{"syntax", "kv: [1\n", []string{"c.yaml:1: invalid YAML: did not find expected ',' or ']'"}},
		{"merge key", "base: &b\n  pages: 1\nkv:\n  <<: *b\n", []string{`unknown key "base"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFileConfig("c.yaml", []byte(tc.text))
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			requireUserFacing(t, err.Error())
		})
	}
}

// TestConfigFileValues: a valid file sets what it says, each with its origin.
func TestConfigFileValues(t *testing.T) {
	text := `# every key once
engine: fake
model: tiny
seed: 18446744073709551615
ranks: 3
cp: 1
router: conversation
overlap: off
kv:
  pages: 512
  tokens_per_page: 32
  host_pages: 0
  enable_block_reuse: false
  event_buffer_max_size: 64
  max_seq_len: 0
kv_events_config:
  enable_kv_cache_events: true
  publisher: zmq
  endpoint: "tcp://*:6000"
  replay_endpoint: "tcp://*:6100"
  topic: kv
  buffer_steps: 50
  hwm: 7
  encoding: map
scheduler:
  max_batch_size: 8
  scheduler_capacity: 6
  max_num_tokens: +2048
  enable_chunked_context: true
  chunk_unit_size: 64
  capacity_policy: GUARANTEED_NO_EVICT
  enable_recompute_pause: false
  admission_lookahead_iterations: 64
  enable_prefix_aware_scheduling: false
  equal_cost:
    kv_cost_offset: 35000
    kv_depth_threshold: 250000
    per_chunk_depth_tokens: 3
  demotion: &dem
    uncached_tokens: 32768
    max_iters: 2
  ctx_cost:
    mode: auto
    percentile: 50
    min_samples: 64
    window: 512
    refresh_interval: 64
    hysteresis: 0
    lockstep_correction: false
conversation_router:
  new_conv_placement: least_tokens
  load_balance_weight: 0.5
attention_dp_config:
  enable_balance: true
  enable_cost_leveling: true
  timeout_iters: 60
  batching_wait_iters: 0
twin:
  gpu: b200
  cost_profile: p.json
  tp: 2
  weight_dtype: fp8
  kv_dtype: fp8
  gpus_per_node: 4
  expert_zipf: 0.5
  cuda_graph: fleet
  cuda_graph_max_batch_size: 256
  moe_dp_padding: true
  host_time: measured
  threads: 3
workload:
  trace: t.jsonl
  limit: 5
  length_scale: 0.05
  arrival_scale: 0
  arrivals: poisson
cpu_threads: 2
cpu_kernels: quant
`
	fc, err := parseFileConfig("c.yaml", []byte(text))
	require.NoError(t, err)
	require.Len(t, fc.settings, len(fileKeys), "every key of the table is in the example")
	o := Defaults()
	fc.apply(&o, map[string]bool{"limit": true})
	require.Equal(t, "fake", o.Engine)
	require.Equal(t, uint64(18446744073709551615), o.Seed)
	require.Equal(t, 3, o.Ranks)
	require.True(t, o.Sources.RanksSet)
	require.Equal(t, "off", o.Overlap)
	require.Equal(t, 512, o.Pages)
	require.Equal(t, 32, o.TokensPerPage)
	require.True(t, o.NoPrefixReuse)
	require.Equal(t, 2048, o.Scheduler.MaxNumTokens)
	require.Equal(t, 6, o.Scheduler.SchedulerCapacity)
	require.False(t, o.Scheduler.RecomputePause)
	require.Equal(t, 64, o.Scheduler.AdmissionLookahead)
	require.Equal(t, executor.ADPBalance{Enable: true, TimeoutIters: 60, BatchingWaitIters: 0, CostLeveling: true}, o.ADPBalance)
	require.Equal(t, "least_tokens", o.NewConvPlacement)
	require.Equal(t, 0.5, o.LoadBalanceWeight)
	require.Equal(t, "measured", o.TwinHostTime)
	require.Equal(t, 3, o.TwinThreads)
	require.False(t, o.Scheduler.PrefixAware)
	require.Equal(t, int64(35000), o.Scheduler.EqualCost.KVOffset)
	require.Equal(t, int64(3), o.Scheduler.EqualCost.PerChunkDepthTokens)
	require.Equal(t, int64(32768), o.Scheduler.Demotion.UncachedTokens)
	require.Equal(t, int64(2), o.Scheduler.Demotion.MaxIters)
	require.Equal(t, "fp8", o.WeightDType)
	require.Equal(t, "fp8", o.KVDType)
	require.Equal(t, 4, o.GPUsPerNode)
	require.Equal(t, 0.5, o.ExpertZipf)
	require.Equal(t, "fleet", o.TwinCUDAGraph)
	require.Equal(t, 256, o.TwinCUDAGraphMaxBatch)
	require.True(t, o.TwinMoEPadding)
	require.Equal(t, "t.jsonl", o.Trace)
	require.Equal(t, 0, o.Limit, "a flag given on the command line wins over the file")
	require.Equal(t, 0.05, o.LengthScale)
	require.Equal(t, 0.0, o.ArrivalScale)
	require.Equal(t, "poisson", o.Arrivals)
	require.Equal(t, 2, o.CPUThreads)
	require.Equal(t, "quant", o.CPUKernels)
	require.Equal(t, KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:6000",
		ReplayEndpoint: "tcp://*:6100", Topic: "kv", BufferSteps: 50, HWM: 7, Encoding: "map"}, o.KVEventsConfig)
	require.True(t, o.kvZMQ())
	// Origins: the file's FILE:LINE key, or the flag.
	require.Equal(t, "c.yaml:10 kv.pages", o.Src("pages"))
	require.Equal(t, "c.yaml:28 scheduler.max_num_tokens", o.Src("max-num-tokens"))
	require.Equal(t, "--limit", o.Src("limit"))
	require.Equal(t, "--report", o.Src("report"))
	require.Equal(t, "c.yaml:36 scheduler.equal_cost.kv_cost_offset", o.Scheduler.Names[scheduler.SettingKVCostOffset])

	// Empty files, comment-only files and empty sections set nothing.
	for _, empty := range []string{"", "# nothing\n", "---\n", "kv:\n"} {
		fc, err := parseFileConfig("c.yaml", []byte(empty))
		require.NoError(t, err, "%q", empty)
		require.Empty(t, fc.settings)
	}
	// Aliases are followed.
	fc, err = parseFileConfig("c.yaml", []byte("kv: &k\n  pages: 7\nscheduler:\n  max_batch_size: &n 9\n  max_num_tokens: *n\n"))
	require.NoError(t, err)
	require.Len(t, fc.settings, 3)
}

// TestConfigErrorsNameTheirOrigin: a value from the file is reported as the
// file's FILE:LINE key, never as the flag it stands in for or as a TLLM_*
// variable; the same value from a flag names the flag.
func TestConfigErrorsNameTheirOrigin(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		args       []string
		want       string
		not        string
	}{
		{"pages", "engine: fake\nkv:\n  pages: 0\n", nil, "c.yaml:3 kv.pages must be at least 1", "--pages must"},
		{"max_num_tokens", "scheduler:\n  max_num_tokens: -5\n", nil, "c.yaml:2 scheduler.max_num_tokens must be non-negative, got -5", "--max-num-tokens"},
		{"engine", "engine: gpu\n", nil, `c.yaml:1 engine "gpu" is not allowed (allowed: cpu, cuda, twin, fake)`, "--engine"},
		{"policy", "scheduler:\n  capacity_policy: fifo\n", nil, `c.yaml:2 scheduler.capacity_policy: capacity policy "fifo" is not allowed`, "--policy"},
		{"equal cost", "scheduler:\n  equal_cost:\n    kv_cost_offset: -5\n", nil,
			"c.yaml:3 scheduler.equal_cost.kv_cost_offset = -5, want ≥ 0", "TLLM_V2_CTX_COST_KV_OFFSET"},
		{"demotion", "scheduler:\n  demotion:\n    max_iters: -1\n", nil,
			"c.yaml:3 scheduler.demotion.max_iters = -1, want ≥ 0", "TLLM_V2"},
		{"pages beyond the index type", "kv:\n  host_pages: 2147483648\n", nil, "c.yaml:2 kv.host_pages must be at most 2147483647 (int32 page indices)", "kvpool"},
		{"twin host time", "twin:\n  host_time: wall\n", nil, `c.yaml:2 twin.host_time "wall" is not allowed (allowed: profile, measured)`, "--twin"},
		{"twin host time flag", "", []string{"--twin-host-time", "cpu"}, `--twin-host-time "cpu" is not allowed (allowed: profile, measured)`, "c.yaml"},
		{"new conversation placement", "conversation_router:\n  new_conv_placement: least_kv\n", nil,
			`c.yaml:2 conversation_router.new_conv_placement "least_kv" is not allowed (allowed: round_robin, least_queued, least_tokens, least_prefill)`, "--new"},
		{"load-balance weight", "conversation_router:\n  new_conv_placement: least_prefill\n  load_balance_weight: -2\n", nil,
			"c.yaml:3 conversation_router.load_balance_weight must be a finite number ≥ 0 (0 = off), got -2", "--load"},
		{"load-balance weight without a token placement", "conversation_router:\n  load_balance_weight: 1\n", nil,
			`c.yaml:2 conversation_router.load_balance_weight 1 weighs each rank's tokens, so it needs --new-conv-placement least_tokens or least_prefill, got "round_robin"`, "c.yaml:1"},
		{"ADP Balance timeout", "attention_dp_config:\n  timeout_iters: -1\n", nil,
			"c.yaml:2 attention_dp_config.timeout_iters must be non-negative, got -1", "--attention"},
		{"admission lookahead", "scheduler:\n  admission_lookahead_iterations: -2\n", nil,
			"c.yaml:2 scheduler.admission_lookahead_iterations = -2, want ≥ 0 (0 = off)", "--admission"},
		{"flag wins and is named", "kv:\n  pages: 64\n", []string{"--pages", "-1"}, "--pages must be non-negative, got -1", "c.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.text)
			code, _, stderr := runCLI(t, append([]string{"run", "--progress", "off", "--config", path}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			want := strings.ReplaceAll(tc.want, "c.yaml", path)
			require.Contains(t, stderr, want)
			require.NotContains(t, stderr, tc.not)
			require.NotContains(t, stderr, "serving", "refused before any work")
			requireUserFacing(t, stderr)
		})
	}
	// A TLLM_* variable overriding the file is named as the variable.
	t.Setenv("TLLM_V2_CTX_COST_KV_OFFSET", "-3")
	path := writeConfig(t, "scheduler:\n  equal_cost:\n    kv_cost_offset: 5\n")
	code, _, stderr := runCLI(t, "run", "--progress", "off", "--config", path)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "TLLM_V2_CTX_COST_KV_OFFSET=-3 is negative")
}

// TestConfigDocumentsEveryKey: docs/config.md shows every key of the file
// under its own name (the example is the reference users copy).
func TestConfigDocumentsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../docs/config.md")
	require.NoError(t, err)
	for _, p := range fileKeyPaths() {
		parts := strings.Split(p, ".")
		require.True(t, strings.Contains(string(doc), parts[len(parts)-1]+":"), "docs/config.md lacks %s", p)
	}
	require.False(t, strings.Contains(string(doc), " kv_offset:"), "the equal-cost key is kv_cost_offset")

	// The example is a valid file, and its values are the defaults.
	_, example, ok := strings.Cut(string(doc), "```yaml\n")
	require.True(t, ok)
	example, _, _ = strings.Cut(example, "```")
	fc, err := parseFileConfig("docs/config.md", []byte(example))
	require.NoError(t, err)
	require.Len(t, fc.settings, len(fileKeys), "the example shows every key")
	o, want := Defaults(), Defaults()
	fc.apply(&o, map[string]bool{})
	require.NoError(t, o.Validate())
	o.Sources.Origin, o.Sources.RanksSet, want.Sources.RanksSet, o.Sources.PagesSet, o.Sources.ReuseOnBy = nil, false, false, false, ""
	o.Scheduler.Names = want.Scheduler.Names
	require.Equal(t, want, o, "the example's values are the defaults")
}
