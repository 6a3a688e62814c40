package fleet

import (
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/nccl"
)

// checkUserFacing fails the fuzz input when an error is not a message for
// a user (usage.Unreadable).
func checkUserFacing(t *testing.T, what string, err error) {
	t.Helper()
	if why := usage.Unreadable(err.Error()); why != "" {
		t.Fatalf("%s: the error %s: %s", what, why, err)
	}
}

// FuzzConfigYAML loads and validates arbitrary bytes as a --config file the
// way `worker run` does before any work: parse, apply under no flags,
// validate, build the scheduler configuration, run the startup checks.
// Nothing may panic; every error is a user-facing message, and the
// parser's errors name the file (and a line where there is one).
func FuzzConfigYAML(f *testing.F) {
	for _, s := range []string{
		"", "engine: fake\nranks: 2\n", "kv:\n  pages: 1.5\n", "ranks: 2.7\n", "engine: fake\n---\nbogus: 1\nranks: -7\n",
		"scheduler:\n  max_num_tokens: 4\n", "scheduler:\n  chunk_unit_size: 2048\n", "cp: 2\nkv:\n  enable_block_reuse: true\n",
		"scheduler:\n  equal_cost:\n    kv_offset: 1\n", "scheduler:\n  equal_cost:\n    kv_cost_offset: 35000\n    kv_depth_threshold: 250000\n",
		"scheduler:\n  demotion: {uncached_tokens: 100, max_iters: -1}\n", "kv: &a\n  pages: 8\nworkload: *a\n",
		"workload:\n  length_scale: .nan\n", "? [x]\n: 1\n", "seed: 18446744073709551616\n", "router: conversation\nranks: 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		fc, err := parseFileConfig("c.yaml", text)
		if err != nil {
			checkUserFacing(t, "parse", err)
			if !strings.HasPrefix(err.Error(), "c.yaml:") {
				t.Fatalf("a config error must start with the file: %v", err)
			}
			return
		}
		for _, s := range fc.settings {
			if s.line < 1 || s.key == nil {
				t.Fatalf("setting without a line or key: %+v", s)
			}
		}
		o := Defaults()
		fc.apply(&o, map[string]bool{})
		if o.CP > 1 && !o.Sources.RanksSet {
			o.Ranks = 1
		}
		if err := o.Validate(); err != nil {
			checkUserFacing(t, "validate", err)
			return
		}
		noEnv := func(string) string { return "" }
		sc, _, err := o.SchedulerConfig(noEnv)
		if err != nil {
			checkUserFacing(t, "scheduler config", err)
			return
		}
		if _, err := o.startupChecks(sc, nccl.Launch{WorldSize: 1}, noEnv); err != nil {
			checkUserFacing(t, "startup checks", err)
		}
	})
}
