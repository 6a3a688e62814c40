//go:build native

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWorkerUnderMPIRunMatchesInProcess: the command under
// `mpirun -np 4` (one rank per process, collectives over MPI) prints the
// same output digest as four in-process ranks, with the conversation router.
func TestWorkerUnderMPIRunMatchesInProcess(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	trace := sharedTrace(t, "synthetic_trace.jsonl")
	args := []string{"run", "--engine", "cpu", "--router", "conversation", "--trace", trace, "--limit", "200",
		"--length-scale", "0.01", "--report", "json", "--progress", "off", "--arrival-scale", "0"}
	inproc := serve(t, bin, append(args[1:], "--ranks", "4")...)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", append([]string{"--oversubscribe", "-np", "4", bin}, args...)...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	var rep report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "exactly one report (rank 0's) on stdout: %s", out.String())
	require.Equal(t, 4, rep.Ranks)
	require.Equal(t, 200, rep.Requests.Completed)
	require.Equal(t, inproc.OutputDigest, rep.OutputDigest, "mpirun -np 4 and --ranks 4 print the same digest")
}

// TestHelixMatchesSingleRankUnderPressure: aggregated Helix over 2 CP ranks
// and a single rank print the same digest on a pool small enough that both
// recompute-pause requests, with the per-iteration schedule check on.
func TestHelixMatchesSingleRankUnderPressure(t *testing.T) {
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	t.Setenv("TLLM_HELIX_AGG_CHECK_SCHEDULE", "1")
	args := []string{"--engine", "cpu", "--trace", trace, "--limit", "100", "--length-scale", "0.02",
		"--tokens-per-page", "16", "--max-num-tokens", "256"}
	one := serve(t, bin, append(args, "--ranks", "1", "--cp", "1", "--pages", "64")...)
	two := serve(t, bin, append(args, "--cp", "2", "--pages", "32")...)
	require.Positive(t, one.Preemptions.Recompute)
	require.Positive(t, two.Preemptions.Recompute, "the Helix run must also be under KV pressure")
	require.Equal(t, one.Requests, two.Requests)
	require.Equal(t, one.OutputDigest, two.OutputDigest, "--cp 2 and --cp 1 print the same digest")
}

// TestHelixScheduleCheckCatchesDivergence: a perturbed plan on CP rank 1 at
// iteration 3 is caught at iteration 3 on every rank.
func TestHelixScheduleCheckCatchesDivergence(t *testing.T) {
	bin := worker(t)
	stderr, _ := failRun(t, bin, []string{"TLLM_HELIX_AGG_CHECK_SCHEDULE=1", "LOCKSTEP_TEST_FAULT=perturb:1:3"},
		"--engine", "cpu", "--cp", "2", "--length-scale", "0.1")
	require.Contains(t, stderr, "rank 0 iteration 3: helix schedule divergence at iteration 3")
	require.Contains(t, stderr, "rank 1: rank 1 iteration 3: helix schedule divergence at iteration 3")
	require.Contains(t, stderr, "sat-out ids differs")
}

// TestHelixGuards: start-up guards name the option, before any collective.
func TestHelixGuards(t *testing.T) {
	bin := worker(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cp", "2", "--ranks", "2"}, "Helix and attention DP are mutually exclusive"},
		{[]string{"--cp", "2", "--host-pages", "64"}, "aggregated Helix does not support a host cache tier"},
		{[]string{"--cp", "2", "--no-prefix-reuse=false"}, "--no-prefix-reuse=false turns block reuse on with --cp 2: aggregated Helix does not support block reuse"},
		{[]string{"--cp", "2", "--engine", "fake"}, "--cp 2 needs --engine cpu or cuda (the fake engine of --engine has no Helix attention)"},
	} {
		stderr, _ := failRun(t, bin, nil, c.args...)
		require.Contains(t, stderr, c.want)
		require.NotContains(t, stderr, "serving", "refused before any work")
	}
}

// TestHelixFatalNamesWorkerSettings (defect 11): with recompute pause off,
// a Helix pool that runs out fails naming the worker's own settings (where
// they came from), not a quota setting this worker does not have.
func TestHelixFatalNamesWorkerSettings(t *testing.T) {
	bin := worker(t)
	cfg := filepath.Join(t.TempDir(), "helix.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("cp: 2\nkv:\n  pages: 24\nscheduler:\n  enable_recompute_pause: false\n"), 0o644))
	stderr, _ := failRun(t, bin, nil, "--config", cfg, "--length-scale", "0.3", "--limit", "32")
	require.Contains(t, stderr, "recompute pause is disabled")
	require.Contains(t, stderr, "enable recompute pause ("+cfg+":5 scheduler.enable_recompute_pause)")
	require.Contains(t, stderr, "size the pool with "+cfg+":3 kv.pages (KV pages per rank) and --tokens-per-page")
	require.NotContains(t, stderr, "max_gpu_total_bytes")
	require.NotContains(t, stderr, "max_tokens")
}

// mpirunWorker runs the worker under mpirun -np n with extra environment and
// returns the combined output and the launcher's error.
func mpirunWorker(t *testing.T, bin string, n int, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := []string{"--oversubscribe", "-np", fmt.Sprint(n)}
	for _, e := range env {
		full = append(full, "-x", strings.SplitN(e, "=", 2)[0])
	}
	full = append(full, bin, "run", "--engine", "cpu", "--progress", "off", "--arrival-scale", "0")
	cmd := exec.CommandContext(ctx, "mpirun", append(full, args...)...)
	cmd.Env = append(append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "mpirun did not finish: %s", out)
	return string(out), err
}

// TestWorkerUnderMPIRunFaults: one process's initialisation fails → every
// process fails before the loop; one process stops → the others exit after
// the collective timeout with the watchdog's report, and mpirun fails.
func TestWorkerUnderMPIRunFaults(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	out, err := mpirunWorker(t, bin, 3, []string{"LOCKSTEP_TEST_FAULT=init:1"})
	require.Error(t, err)
	require.Contains(t, out, "rank 1: injected initialisation failure")
	// The others fail in the vote too ("KV cache manager initialisation
	// failed on another rank"), unless mpirun tore them down first.

	start := time.Now()
	out, err = mpirunWorker(t, bin, 3, []string{"LOCKSTEP_TEST_FAULT=stop:1:3"}, "--length-scale", "0.2", "--collective-timeout", "3s")
	require.Error(t, err)
	require.Less(t, time.Since(start), 60*time.Second)
	require.Contains(t, out, `allgather:"batch_size" at iteration 3 timed out after 3s`)
	require.Contains(t, out, "rank 1 last entered")
}

// TestADPBalanceUnderMPIRunMatchesInProcess (issue 25): with
// --attention-dp-balance, and with cost leveling beside it, `mpirun -np 4`
// (the counts and costs gathered over MPI) makes the decisions of four
// in-process ranks: the same digest, the same iterations and the same
// number of iterations whose contexts were held or leveled.
func TestADPBalanceUnderMPIRunMatchesInProcess(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	for _, modes := range [][]string{{"--attention-dp-balance"}, {"--attention-dp-balance", "--attention-dp-cost-leveling"}} {
		args := append([]string{"--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--trace",
			sharedTrace(t, "conversation_trace.jsonl"), "--limit", "100", "--report", "json"}, modes...)
		inproc := serve(t, bin, append(args, "--ranks", "4", "--arrival-scale", "0", "--progress", "off")...)
		require.NotNil(t, inproc.Balance)
		require.Positive(t, inproc.Balance.Held, "%v: the contexts were held in some iteration", modes)
		if len(modes) > 1 {
			require.Positive(t, inproc.Balance.Leveled, "%v: some pass was leveled", modes)
		}
		out, stderr, err, _ := mpirunRun(t, bin, 4, nil, args...)
		require.NoError(t, err, stderr)
		var rep report
		require.NoError(t, json.Unmarshal([]byte(out), &rep), "exactly one report (rank 0's): %s", out)
		require.Equal(t, 4, rep.Ranks)
		require.Equal(t, inproc.Requests, rep.Requests)
		require.Equal(t, inproc.OutputDigest, rep.OutputDigest, "%v: mpirun -np 4 and --ranks 4 print the same digest", modes)
		require.Equal(t, inproc.Iterations, rep.Iterations, "%v", modes)
		require.Equal(t, *inproc.Balance, *rep.Balance, "%v: the same balance, held and leveled iterations included", modes)
	}
}

// TestLeastPrefillUnderMPIRunMatchesInProcess: with least_prefill placement
// the ranks gather a 14th rank-state value (their pending prefill) and
// place new conversations by it; with a load-balance weight returning ones
// may move. `mpirun -np 4` (the states gathered over MPI, rank 0's intake
// riding after its longer state) places as four in-process ranks do: the
// same digest, iterations, waste and token balance. (That the value is
// gathered and read is TestRankStatePendingPrefill's and the router's.)
func TestLeastPrefillUnderMPIRunMatchesInProcess(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	args := []string{"--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--trace",
		sharedTrace(t, "conversation_trace.jsonl"), "--limit", "150", "--report", "json", "--router", "conversation",
		"--infer-conversations", "--new-conv-placement", "least_prefill", "--load-balance-weight", "1"}
	inproc := serve(t, bin, append(slices.Clone(args), "--ranks", "4", "--arrival-scale", "0", "--progress", "off")...)
	require.NotNil(t, inproc.Balance)
	out, stderr, err, _ := mpirunRun(t, bin, 4, nil, args...)
	require.NoError(t, err, stderr)
	var rep report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "exactly one report (rank 0's): %s", out)
	require.Equal(t, 4, rep.Ranks)
	require.Equal(t, inproc.Requests, rep.Requests)
	require.Equal(t, inproc.OutputDigest, rep.OutputDigest, "mpirun -np 4 and --ranks 4 print the same digest")
	require.Equal(t, inproc.Iterations, rep.Iterations)
	require.Equal(t, inproc.LockstepWaste, rep.LockstepWaste, "the same placements")
	require.Equal(t, inproc.Balance.TokenRatio, rep.Balance.TokenRatio, "the same placements")
}
