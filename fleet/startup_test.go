package fleet

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/nccl"
)

// fakeRun is a run of the fake engine on the built-in sample, small.
var fakeRun = []string{"run", "--progress", "off", "--arrival-scale", "0", "--engine", "fake", "--length-scale", "0.05", "--limit", "8"}

// TestImpossibleBudgetsRefusedAtStartup (defect 5): a token budget below
// the chunk unit with chunked prefill could never schedule a chunk of a
// long prompt; the worker refuses it before any work, naming both settings
// and where they came from, instead of stalling after 1 000 passes.
func TestImpossibleBudgetsRefusedAtStartup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string
		args   []string
		want   []string
	}{
		{"M below the page", "", []string{"--max-num-tokens", "4"},
			[]string{"chunk unit --tokens-per-page (the chunk unit while --chunk-unit is 0) = 16", "token budget --max-num-tokens = 4"}},
		{"unit above M", "", []string{"--chunk-unit", "2048"},
			[]string{"chunk unit --chunk-unit = 2048", "token budget --max-num-tokens = 1024"}},
		{"from the file", "scheduler:\n  max_num_tokens: 8\n  chunk_unit_size: 32\n", nil,
			[]string{"chunk unit c.yaml:3 scheduler.chunk_unit_size = 32", "token budget c.yaml:2 scheduler.max_num_tokens = 8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{}, fakeRun...)
			if tc.config != "" {
				path := writeConfig(t, tc.config)
				args = append(args, "--config", path)
				for i := range tc.want {
					tc.want[i] = strings.ReplaceAll(tc.want[i], "c.yaml", path)
				}
			}
			code, stdout, stderr := runCLI(t, append(args, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
			require.NotContains(t, stderr, "serving", "refused before any work")
			require.NotContains(t, stderr, "stalled")
			require.Empty(t, stdout)
		})
	}
	// Without chunking a small M only rejects long prompts on arrival:
	// allowed while some request fits it …
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--max-num-tokens", "30", "--chunked-prefill=false")...)
	require.Equal(t, 0, code, stderr)
	// … and refused up front when none does (nothing could be served).
	code, _, stderr = runCLI(t, append(append([]string{}, fakeRun...), "--max-num-tokens", "4", "--chunked-prefill=false")...)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "can ever be served")
}

// TestHelixBlockReuse (defect 10, executor.md §11.4 P-08): block reuse
// turned on explicitly with Helix is a startup error naming the setting;
// at its default Helix turns it off with one note.
func TestHelixBlockReuse(t *testing.T) {
	path := writeConfig(t, "cp: 2\nengine: cpu\nkv:\n  enable_block_reuse: true\n")
	code, _, stderr := runCLI(t, "run", "--progress", "off", "--config", path)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, path+":4 kv.enable_block_reuse turns block reuse on with "+path+":1 cp 2")
	require.Contains(t, stderr, "aggregated Helix does not support block reuse")
	require.NotContains(t, stderr, "serving")

	code, _, stderr = runCLI(t, "run", "--progress", "off", "--cp", "2", "--no-prefix-reuse=false")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--no-prefix-reuse=false turns block reuse on with --cp 2")

	// The flag turning reuse off wins over the file turning it on.
	opts, notes := startupOf(t, nil, "--cp", "2", "--no-prefix-reuse", "--config", path)
	require.True(t, opts.NoPrefixReuse)
	require.NotContains(t, strings.Join(notes, "\n"), "block reuse")

	_, notes = startupOf(t, nil, "--cp", "2")
	require.Contains(t, notes, "aggregated Helix turns block reuse off (a ledger block's bytes span CP ranks)")
	_, notes = startupOf(t, nil, "--ranks", "2")
	require.NotContains(t, strings.Join(notes, "\n"), "block reuse")
}

// startupOf merges args and runs the startup checks in-process, as runServe
// does, under env (a nil map reads nothing).
func startupOf(t *testing.T, env map[string]string, args ...string) (*Options, []string) {
	t.Helper()
	o, notes, err := startupErr(env, args...)
	require.NoError(t, err)
	return o, notes
}

func startupErr(env map[string]string, args ...string) (*Options, []string, error) {
	o, err := ParseArgs(args, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	getenv := func(k string) string { return env[k] }
	sc, notes, err := o.SchedulerConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	more, err := o.startupChecks(sc, nccl.Launch{WorldSize: 1}, getenv)
	return o, append(notes, more...), err
}

// TestStartupEnvironmentChecks (defect 9): debugging and test variables that
// would silently do nothing are refused at startup, naming the variable,
// what was wrong and what is allowed.
func TestStartupEnvironmentChecks(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{executor.ScheduleCheckEnv: "garbage"}, []string{"--cp", "2"},
			`TLLM_HELIX_AGG_CHECK_SCHEDULE="garbage" is not allowed (allowed: "1" to check every iteration, "0" or unset for off)`},
		{map[string]string{executor.ScheduleCheckEnv: "yes"}, nil, `TLLM_HELIX_AGG_CHECK_SCHEDULE="yes" is not allowed`},
		{map[string]string{FaultEnv: "stop:4:3"}, []string{"--ranks", "4"},
			`LOCKSTEP_TEST_FAULT="stop:4:3": rank 4 is outside the world of 4 ranks (0–3)`},
		{map[string]string{FaultEnv: "init:9"}, []string{"--cp", "2"}, "rank 9 is outside the world of 2 ranks"},
		{map[string]string{FaultEnv: "stop:1:-2"}, nil, `iteration "-2" is not a non-negative integer`},
		{map[string]string{FaultEnv: "stop:1:x"}, nil, `iteration "x" is not a non-negative integer`},
		{map[string]string{FaultEnv: "stop:z:1"}, nil, `rank "z" is not a non-negative integer`},
		{map[string]string{FaultEnv: "crash:1"}, nil, `unknown kind "crash"`},
		{map[string]string{FaultEnv: "perturb:1:3"}, []string{"--ranks", "2"},
			"perturb changes one rank's plan, which only the Helix schedule check compares"},
		{map[string]string{FaultEnv: "perturb:1:3"}, []string{"--cp", "2"}, "it needs --cp > 1 and TLLM_HELIX_AGG_CHECK_SCHEDULE=1"},
	} {
		_, _, err := startupErr(tc.env, tc.args...)
		require.ErrorContains(t, err, tc.want, "%v %v", tc.env, tc.args)
		require.True(t, usage.Is(err), "a usage error (exit 2)")
	}
	// The accepted forms.
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{map[string]string{executor.ScheduleCheckEnv: "0"}, nil},
		{map[string]string{executor.ScheduleCheckEnv: "1", FaultEnv: "perturb:1:3"}, []string{"--cp", "2"}},
		{map[string]string{FaultEnv: "stop:3:0"}, []string{"--ranks", "4"}},
	} {
		_, _, err := startupErr(tc.env, tc.args...)
		require.NoError(t, err, "%v %v", tc.env, tc.args)
	}
	// The CLI path reads the real environment.
	t.Setenv(executor.ScheduleCheckEnv, "garbage")
	code, _, stderr := runCLI(t, fakeRun...)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "TLLM_HELIX_AGG_CHECK_SCHEDULE")
	require.NotContains(t, stderr, "serving")
}

// TestLaunchConflictsRefusedAtStartup: under a launcher, settings that
// contradict the launch are refused before any work, naming their origin.
func TestLaunchConflictsRefusedAtStartup(t *testing.T) {
	path := writeConfig(t, "ranks: 3\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", path}, path + ":1 ranks 3 does not match the mpirun launch of 2 processes"},
		{[]string{"--cp", "4"}, "--cp 4 under a mpirun launch of 2 processes: Helix runs one CP rank per process; launch exactly 4 processes"},
	} {
		o := Defaults()
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(tc.args))
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		require.NoError(t, o.MergeConfig(set))
		sc, _, err := o.SchedulerConfig(func(string) string { return "" })
		require.NoError(t, err)
		_, err = o.startupChecks(sc, nccl.Launch{Launcher: "mpirun", WorldSize: 2, Rank: 1}, func(string) string { return "" })
		require.ErrorContains(t, err, tc.want)
	}
}

// TestFaultThatNeverFiresWarns: a fault whose iteration the run never
// reaches is reported when the run ends instead of passing silently.
func TestFaultThatNeverFiresWarns(t *testing.T) {
	t.Setenv(FaultEnv, "stop:1:99999999")
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "2")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, `LOCKSTEP_TEST_FAULT="stop:1:99999999": the run ended before rank 1 reached iteration 99999999; nothing was injected`)
}

// TestProfileLogRanksOutsideTheWorld (defect 9): TLLM_PROFILE_LOG_RANKS
// naming a rank the run does not have warns (spec §13.1 ignores bad entries
// with one warning) and says when nothing is logged at all.
func TestProfileLogRanksOutsideTheWorld(t *testing.T) {
	sel, w := selectLogRanks("99", 4)
	require.Equal(t, []bool{false, false, false, false}, sel)
	require.Equal(t, `TLLM_PROFILE_LOG_RANKS="99": ignoring ranks outside the world of 4 (ranks 0–3): 99; no rank writes an iteration log`, w)
	sel, w = selectLogRanks("1, 7,x", 2)
	require.Equal(t, []bool{false, true}, sel)
	require.Contains(t, w, `ignoring entries that are not non-negative integers: "x"`)
	require.Contains(t, w, "ignoring ranks outside the world of 2 (ranks 0–1): 7")
	require.NotContains(t, w, "no rank writes")

	t.Setenv("TLLM_PROFILE_LOG_RANKS", "99")
	dir := t.TempDir()
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--iter-log", dir+"/it-{rank}.jsonl")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "ignoring ranks outside the world of 4")
}

// TestDemotionWithoutEstimatesNotes (defect 14): demotion configured where
// no router publishes an uncached estimate gets one startup note saying
// why and how to turn it on; where it works, no note.
func TestDemotionWithoutEstimatesNotes(t *testing.T) {
	env := map[string]string{"TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS": "32768"}
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{[]string{"--ranks", "1", "--router", "conversation"}, "one rank (--ranks 1) runs no router"},
		{[]string{"--ranks", "4"}, "the default router (--router) publishes none"},
		{[]string{"--cp", "2"}, "Helix CP (--cp 2) runs no router"},
	} {
		_, notes := startupOf(t, env, tc.args...)
		joined := strings.Join(notes, "\n")
		require.Contains(t, joined, "long-prefill demotion (TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS = 32768) will demote nothing", "%v", tc.args)
		require.Contains(t, joined, tc.why)
		require.Contains(t, joined, "run --router conversation with --ranks > 1")
		require.Equal(t, 1, strings.Count(joined, "demote nothing"), "one note")
	}
	_, notes := startupOf(t, env, "--ranks", "4", "--router", "conversation")
	require.NotContains(t, strings.Join(notes, "\n"), "demote nothing")
	// Demotion off (chunking off) is ConfigFromEnv's note, not this one.
	_, notes = startupOf(t, env, "--ranks", "1", "--chunked-prefill=false")
	require.NotContains(t, strings.Join(notes, "\n"), "demote nothing")
	// From the config file, the note names the file's key.
	path := writeConfig(t, "scheduler:\n  demotion:\n    uncached_tokens: 100\n")
	_, notes = startupOf(t, nil, "--ranks", "1", "--config", path)
	require.Contains(t, strings.Join(notes, "\n"), fmt.Sprintf("long-prefill demotion (%s:3 scheduler.demotion.uncached_tokens = 100)", path))
	// The CLI logs it.
	t.Setenv("TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS", "1000")
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "1")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "will demote nothing")
}

// TestFirstRootCause (defect 9): in a stopped-rank run the first line names
// the rank where the failure began, not the first rank that timed out.
func TestFirstRootCause(t *testing.T) {
	timeout := fmt.Errorf("rank 0 iteration 3: collective #19 timed out: %w", nccl.ErrTimeout)
	timeout2 := fmt.Errorf("rank 2 iteration 3: collective #19 timed out: %w", nccl.ErrTimeout)
	stopped := errors.New("rank 1 iteration 3: injected fault: rank 1 stopped at iteration 3")
	closed := fmt.Errorf("rank 3: peer closed: %w", nccl.ErrClosed)
	for _, tc := range []struct {
		errs  []error
		first string
	}{
		{[]error{timeout, stopped, timeout2}, "rank 1 iteration 3: injected fault"},
		{[]error{closed, timeout, nil}, "rank 0 iteration 3: collective #19 timed out"},
		{[]error{closed, fmt.Errorf("vote: %w", executor.ErrInitFailedElsewhere), errors.New("rank 2: boom")}, "rank 2: boom"},
		{[]error{closed, nil}, "rank 3: peer closed"},
	} {
		err := firstRootCause(tc.errs)
		require.Error(t, err)
		first, _, _ := strings.Cut(err.Error(), "\n")
		require.True(t, strings.HasPrefix(first, tc.first), "first line %q, want %q", first, tc.first)
	}
	require.NoError(t, firstRootCause([]error{nil, nil}))
}

// TestMultiProcessHelixChecks: --cp under a launcher runs one CP rank per
// process (exchanging over MPI or TCP); the shapes it cannot run are refused at startup, naming
// the flag, the launch and what to do instead.
func TestMultiProcessHelixChecks(t *testing.T) {
	mpi := func(n int) nccl.Launch { return nccl.Launch{Launcher: nccl.LauncherOpenMPI, WorldSize: n} }
	for _, tc := range []struct {
		args   []string
		launch nccl.Launch
		want   string // "" = accepted
	}{
		{[]string{"--cp", "2"}, mpi(2), ""},
		{[]string{"--cp", "4"}, mpi(4), ""},
		{[]string{"--cp", "4"}, nccl.Launch{Launcher: nccl.LauncherSlurm, WorldSize: 4}, ""},
		{[]string{"--cp", "2"}, mpi(4), "--cp 2 under a openmpi launch of 4 processes: attention DP together with Helix (2 DP groups of 2 CP ranks) is not supported"},
		{[]string{"--cp", "4"}, mpi(2), "Helix runs one CP rank per process; launch exactly 4 processes"},
		{[]string{"--cp", "3"}, mpi(4), "launch exactly 3 processes"},
		{[]string{"--cp", "2"}, nccl.Launch{Launcher: nccl.LauncherTorchrun, WorldSize: 2}, ""},
	} {
		o := Defaults()
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(tc.args))
		err := o.checkMultiProcessHelix(tc.launch)
		if tc.want == "" {
			require.NoError(t, err, "%v %v", tc.args, tc.launch)
			continue
		}
		require.ErrorContains(t, err, tc.want, "%v %v", tc.args, tc.launch)
		require.True(t, usage.Is(err), "a usage error (exit 2)")
	}
}

// TestFaultedPlannerKeepsTheCalibrator (issue 21, item 5): a run with the
// online calibrator (ctx_cost auto) and a fault that never fires is the run
// without the fault: the faulty planner forwards the scheduler's
// publications, and the executor checks for them when it is built, not
// thousands of iterations in.
func TestFaultedPlannerKeepsTheCalibrator(t *testing.T) {
	trace := filepath.Join("..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	args := []string{"run", "--engine", "twin", "--ctx-cost", "auto", "--ranks", "2", "--trace", trace, "--limit", "150",
		"--arrival-scale", "0", "--report", "json", "--progress", "off"}
	code, want, stderr := runCLI(t, args...)
	require.Equal(t, 0, code, stderr)
	t.Setenv(FaultEnv, "stop:1:100000000")
	code, got, stderr := runCLI(t, args...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "nothing was injected")
	digest := func(report string) string {
		var r struct {
			OutputDigest string `json:"output_digest"`
		}
		require.NoError(t, json.Unmarshal([]byte(report), &r), report)
		return r.OutputDigest
	}
	require.Equal(t, digest(want), digest(got))
}

// TestInjectedEnvironmentReachesTheRanks (issue 21, item 6): the schedule
// check is read through the run's getenv (worker eval's private
// environment), not the process's: a perturbed plan is caught with the
// check set only there.
func TestInjectedEnvironmentReachesTheRanks(t *testing.T) {
	t.Setenv(executor.ScheduleCheckEnv, "")
	env := map[string]string{executor.ScheduleCheckEnv: "1", FaultEnv: "perturb:1:3"}
	o, err := ParseArgs([]string{"--engine", "cpu", "--cp", "2", "--length-scale", "0.1", "--progress", "off"}, io.Discard)
	require.NoError(t, err)
	_, err = Run(o, io.Discard, func(k string) string { return env[k] })
	require.ErrorContains(t, err, "rank 0 iteration 3: helix schedule divergence at iteration 3")
	require.ErrorContains(t, err, "sat-out ids differs")
}

// TestCUDAEngineGuards: --engine cuda on a library without CUDA is refused
// first, naming the build; with CUDA but without NCCL, a MoE model on
// several ranks is refused naming NCCL (the CUDA engine's expert
// parallelism), and one rank or Helix is not.
func TestCUDAEngineGuards(t *testing.T) {
	built, usable := cudaBuilt, ncclUsable
	t.Cleanup(func() { cudaBuilt, ncclUsable = built, usable })
	cudaBuilt = func() bool { return false }
	_, _, err := startupErr(nil, "--engine", "cuda", "--model", "moe-tiny", "--ranks", "2")
	require.ErrorContains(t, err, "--engine cuda: this engine library was built without the CUDA backend")
	require.True(t, usage.Is(err), "a usage error (exit 2)")

	cudaBuilt = func() bool { return true }
	ncclUsable = func() error { return errors.New("built without NCCL") }
	_, _, err = startupErr(nil, "--engine", "cuda", "--model", "moe-tiny", "--ranks", "2")
	require.ErrorContains(t, err, "the cuda engine's expert parallelism runs over NCCL, which this engine library cannot open (built without NCCL)")
	for _, args := range [][]string{
		{"--engine", "cuda", "--model", "moe-tiny", "--ranks", "1"},
		{"--engine", "cuda", "--model", "tiny", "--cp", "2"},
	} {
		_, _, err := startupErr(nil, args...)
		require.NoError(t, err, "%v", args)
	}
}

// TestNoValveNotedAtStartup: max_utilization with recompute pause off and
// no host tier has no way to free KV pages under pressure (a request that
// cannot grow suspends in place); the run says so at startup, naming where
// each setting came from, and still runs a workload that fits. A host tier
// or guaranteed_no_evict is a valve (or needs none): no note.
func TestNoValveNotedAtStartup(t *testing.T) {
	path := writeConfig(t, "scheduler:\n  enable_recompute_pause: false\n")
	const note = "and no host tier (--host-pages 0) cannot free KV pages under pressure"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--policy", "max_utilization"}, true},
		{[]string{"--policy", "max_utilization", "--host-pages", "64"}, false},
		{[]string{"--policy", "guaranteed_no_evict"}, false},
	} {
		args := append(append([]string{}, fakeRun...), "--config", path)
		code, _, stderr := runCLI(t, append(args, tc.args...)...)
		require.Equal(t, 0, code, stderr)
		if !tc.want {
			require.NotContains(t, stderr, note, "%v", tc.args)
			continue
		}
		require.Contains(t, stderr, "max_utilization with recompute pause disabled ("+path+":2 scheduler.enable_recompute_pause) "+note)
	}
}
