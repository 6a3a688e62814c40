//go:build native

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/racetest"
)

// TestRandomDeploymentsAgreeUnderMPIRun draws deployments of the sweeps
// above (the twin's on 2 to 4 attention-DP ranks, the CPU engine's on 2 or 3
// ranks or a Helix group of 2 or 4, with their scheduler knobs) and runs
// each twice: its ranks in one process, then one rank per process under
// mpirun. Every decision a rank takes from the gathered states (routing,
// admission, ADP Balance, cost leveling, recompute victims) must come out
// the same across processes: the same requests served, the same output
// digest and the same number of iterations. Helix runs also check every CP
// rank's schedule each iteration (TLLM_HELIX_AGG_CHECK_SCHEDULE=1). A
// deployment that one way refuses must refuse the other way too.
// LOCKSTEP_SWEEP_RUNS / LOCKSTEP_SWEEP_FIRST / LOCKSTEP_SWEEP_DIR as for the
// other sweeps (default 10 deployments, about 20 s).
func TestRandomDeploymentsAgreeUnderMPIRun(t *testing.T) {
	if racetest.Enabled {
		t.Skip("end-to-end runs of the worker binary: covered by the normal pass")
	}
	needMPIRun(t)
	first, last := sweepSeeds(t, 10)
	bin := worker(t)
	dir := sweepDir(t)
	agreed, refused := 0, 0
	for seed := first; seed <= last; seed++ {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x3a1))
		path := filepath.Join(dir, fmt.Sprintf("mpi-%d.jsonl", seed))
		var n int
		var args []string
		if rng.IntN(2) == 0 {
			// Fewer and shorter requests than the in-process sweeps: under
			// mpirun on an oversubscribed CI machine an iteration costs
			// milliseconds (Open MPI yields while it waits), not microseconds.
			n = sweepTraceOf(t, rng, path, []int{20, 60}, []int{16, 128})
			args = drawTwinDeployment(rng, path, "2", "3", "4")
		} else {
			n = cpuSweepTrace(t, rng, path)
			for args = cpuSweepArgs(rng, path); processes(args) == 1; args = cpuSweepArgs(rng, path) {
			}
		}
		args = append(args, drawSchedulerKnobs(rng, path)...)
		np := processes(args)
		cmdline := "bin/worker " + strings.Join(args, " ")

		one, oneErr := runAgreement(t, exec.Command(bin, args...))
		full := append([]string{"--oversubscribe", "-np", strconv.Itoa(np), bin}, args...)
		many, manyErr := runAgreement(t, exec.Command("mpirun", full...))
		if oneErr != nil {
			require.Error(t, manyErr, "seed %d: refused in one process (%v) but ran under mpirun: %s", seed, oneErr, cmdline)
			refused++
			continue
		}
		require.NoError(t, manyErr, "seed %d: ran in one process but not under mpirun -np %d: %s", seed, np, cmdline)
		require.Equal(t, n, one.Requests.Total, "seed %d: %s", seed, cmdline)
		require.Equal(t, one.Requests, many.Requests, "seed %d: mpirun -np %d: %s", seed, np, cmdline)
		require.Equal(t, one.OutputDigest, many.OutputDigest, "seed %d: mpirun -np %d: %s", seed, np, cmdline)
		require.Equal(t, one.Iterations, many.Iterations, "seed %d: mpirun -np %d: %s", seed, np, cmdline)
		agreed++
	}
	t.Logf("%d deployments agreed in one process and under mpirun, %d refused both ways", agreed, refused)
	require.Positive(t, agreed)
}

// processes is the world size of a drawn deployment: ranks × cp.
func processes(args []string) int {
	get := func(flag string) int {
		i := slices.Index(args, flag)
		if i < 0 || i+1 >= len(args) {
			return 1
		}
		v, err := strconv.Atoi(args[i+1])
		if err != nil {
			return 1
		}
		return v
	}
	return get("--ranks") * get("--cp")
}

// runAgreement runs one side of TestRandomDeploymentsAgreeUnderMPIRun: the
// report on success; a refusal (exit status 2, or "can ever be served") as
// an error; anything else (a crash, a stall, a lost request, three minutes
// without an end) fails the test.
func runAgreement(t *testing.T, cmd *exec.Cmd) (report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"TLLM_HELIX_AGG_CHECK_SCHEDULE=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	cmdline := strings.Join(cmd.Args, " ")
	require.NoError(t, ctx.Err(), "no end in 3 minutes: %s", cmdline)
	require.False(t, isPanic(errb.String()), "panicked: %s\n%s", lastLines(errb.String(), 30), cmdline)
	if err != nil {
		// mpirun exits with the status of the first rank that failed.
		var exit *exec.ExitError
		refusal := errors.As(err, &exit) && (exit.ExitCode() == 2 ||
			exit.ExitCode() == 1 && strings.Contains(errb.String(), "can ever be served with this configuration"))
		require.True(t, refusal, "%v: %s\n%s", err, lastLines(errb.String(), 10), cmdline)
		return report{}, err
	}
	var rep report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "exactly one report: %s\n%s", out.String(), cmdline)
	require.Equal(t, rep.Requests.Total, rep.Requests.Completed+rep.Requests.Rejected, "a request was lost: %s", cmdline)
	return rep, nil
}
