//go:build native

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mpirunRun runs `bin/worker run` under mpirun -np n with env added and
// returns stdout, stderr, the exit error and how long it took.
func mpirunRun(t *testing.T, bin string, n int, env []string, args ...string) (string, string, error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	full := append([]string{"--oversubscribe", "-np", strconv.Itoa(n), bin, "run", "--progress", "off",
		"--arrival-scale", "0"}, args...)
	cmd := exec.CommandContext(ctx, "mpirun", full...)
	cmd.Env = append(append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "mpirun did not finish: %s", errb.String())
	return out.String(), errb.String(), err, time.Since(start)
}

// helixPressureArgs: a pool of 64 pages of 16 tokens in all (64 / cp per CP
// rank) under 100 conversation requests, small enough that every run
// preempts by recompute.
func helixPressureArgs(t *testing.T) []string {
	return []string{"--engine", "cpu", "--trace", sharedTrace(t, "conversation_trace.jsonl"), "--limit", "100",
		"--length-scale", "0.02", "--tokens-per-page", "16", "--max-num-tokens", "256"}
}

// TestHelixUnderMPIRunMatchesSingleRank (issue 15): one CP rank per process
// under mpirun, the attention partials exchanged over MPI every layer, prints
// the same output digest as a single rank with the same pool, for cp = 2 and
// 4, in both loops, under recompute pressure, with the schedule check on
// (TLLM_HELIX_AGG_CHECK_SCHEDULE=1: any divergence would fail the run).
func TestHelixUnderMPIRunMatchesSingleRank(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	t.Setenv("TLLM_HELIX_AGG_CHECK_SCHEDULE", "1")
	args := helixPressureArgs(t)
	for _, overlap := range []string{"on", "off"} {
		one := serve(t, bin, append(args, "--cp", "1", "--pages", "64", "--overlap", overlap)...)
		require.Positive(t, one.Preemptions.Recompute)
		for _, cp := range []int{2, 4} {
			out, stderr, err, _ := mpirunRun(t, bin, cp, nil, append(args, "--report", "json", "--cp", strconv.Itoa(cp),
				"--pages", strconv.Itoa(64/cp), "--overlap", overlap)...)
			require.NoError(t, err, stderr)
			var rep report
			require.NoError(t, json.Unmarshal([]byte(out), &rep), "exactly one report (rank 0's): %s", out)
			t.Logf("overlap %s cp %d: digest %s, recompute preemptions %d (cp 1: %d), completed %d",
				overlap, cp, rep.OutputDigest, rep.Preemptions.Recompute, one.Preemptions.Recompute, rep.Requests.Completed)
			require.Positive(t, rep.Preemptions.Recompute, "cp %d must be under KV pressure", cp)
			require.Equal(t, one.Requests, rep.Requests)
			require.Equal(t, one.OutputDigest, rep.OutputDigest, "mpirun --cp %d (overlap %s) and --cp 1 print the same digest", cp, overlap)
		}
	}
}

// TestHelixUnderMPIRunFaults (issue 15): a CP rank that stops inside the
// per-layer exchange, a perturbed plan on one CP rank and an init failure on
// one CP rank each end the job with a named error well within the
// collective timeout's bound.
func TestHelixUnderMPIRunFaults(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	args := append(helixPressureArgs(t), "--collective-timeout", "2s", "--pages", "32")
	for _, tc := range []struct {
		name  string
		cp    int
		env   []string
		wants []string
	}{
		{"rank stops inside the exchange", 2, []string{"LOCKSTEP_TEST_FAULT=stall:1:5"}, []string{
			"rank 0 iteration", "engine wait: TIMEOUT",
			"Helix attention exchange at layer",
			"(rank 0 of 2, MPI): timed out after 2000 ms; waiting for rank 1 (last received from it: Helix attention exchange at layer"}},
		{"rank stops inside the exchange, cp 4", 4, []string{"LOCKSTEP_TEST_FAULT=stall:2:3"}, []string{
			"engine wait: TIMEOUT",
			"of 4, MPI): timed out after 2000 ms; waiting for rank 2 (last received from it: Helix attention exchange at layer"}},
		{"rank stops entering collectives", 2, []string{"LOCKSTEP_TEST_FAULT=stop:1:4"}, []string{
			"timed out after 2s on rank 0", "rank 1 last entered"}},
		{"perturbed plan", 2, []string{"TLLM_HELIX_AGG_CHECK_SCHEDULE=1", "LOCKSTEP_TEST_FAULT=perturb:1:4"}, []string{
			"iteration 4: helix schedule divergence at iteration 4: sat-out ids differs: rank 0 [], rank 1 ["}},
		{"init failure", 2, []string{"LOCKSTEP_TEST_FAULT=init:1"}, []string{
			"rank 1: injected initialisation failure"}}, // the others fail in the vote, unless mpirun tore them down first
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err, took := mpirunRun(t, bin, tc.cp, tc.env, append(args, "--cp", strconv.Itoa(tc.cp))...)
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "the job must fail: %v\n%s", err, stderr)
			require.Less(t, took, 30*time.Second, "the job waited for the faulty rank")
			for _, w := range tc.wants {
				require.Contains(t, stderr, w)
			}
		})
	}
}

// TestHelixUnderLaunchersRefused: the shapes multi-process Helix cannot run
// are refused at startup with exit 2, before any collective.
func TestHelixUnderLaunchersRefused(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	_, stderr, err, _ := mpirunRun(t, bin, 4, nil, "--engine", "cpu", "--cp", "2")
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), stderr)
	require.Contains(t, stderr, "--cp 2 under a openmpi launch of 4 processes: attention DP together with Helix (2 DP groups of 2 CP ranks) is not supported")
	// The seed's Helix guards hold across processes too.
	cfg := filepath.Join(t.TempDir(), "helix.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("cp: 2\nkv:\n  pages: 24\nscheduler:\n  enable_recompute_pause: false\n"), 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "cpu", "--cp", "2", "--host-pages", "64"}, "--host-pages 64 with --cp 2: aggregated Helix does not support a host cache tier"},
		{[]string{"--engine", "cpu", "--cp", "2", "--no-prefix-reuse=false"}, "--no-prefix-reuse=false turns block reuse on with --cp 2: aggregated Helix does not support block reuse"},
		{[]string{"--engine", "cpu", "--config", cfg, "--length-scale", "0.3", "--limit", "32"},
			"under Helix and recompute pause is disabled; enable recompute pause (" + cfg + ":5 scheduler.enable_recompute_pause)"},
	} {
		_, stderr, err, _ := mpirunRun(t, bin, 2, nil, tc.args...)
		require.True(t, errors.As(err, &ee), stderr)
		require.Contains(t, stderr, tc.want)
	}
}

// torchrunWorkers starts `bin/worker run` as n processes with torchrun-style
// variables (the TCP control plane and, for Helix, the TCP exchange mesh)
// and returns rank 0's stdout and every rank's stderr and exit error.
func torchrunWorkers(t *testing.T, bin string, n int, env []string, args ...string) (string, []string, []error, time.Duration) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	outs := make([]bytes.Buffer, n)
	errbs := make([]bytes.Buffer, n)
	start := time.Now()
	for r := range n {
		cmd := exec.CommandContext(ctx, bin, append([]string{"run", "--progress", "off", "--arrival-scale", "0"}, args...)...)
		cmd.Env = append(append(os.Environ(), fmt.Sprintf("RANK=%d", r), fmt.Sprintf("LOCAL_RANK=%d", r),
			fmt.Sprintf("WORLD_SIZE=%d", n), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", n), "MASTER_ADDR=127.0.0.1",
			fmt.Sprintf("MASTER_PORT=%d", port), "LOCKSTEP_JOB_TOKEN=helix-tcp-test-token-0123456789ab"), env...)
		cmd.Stdout, cmd.Stderr = &outs[r], &errbs[r]
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
	}
	errs := make([]error, n)
	stderrs := make([]string, n)
	for r, cmd := range cmds {
		errs[r] = cmd.Wait()
		stderrs[r] = errbs[r].String()
	}
	require.NoError(t, ctx.Err(), "the ranks did not finish: %v", stderrs)
	return outs[0].String(), stderrs, errs, time.Since(start)
}

// TestHelixUnderTorchrunMatchesSingleRank (issue 15): a torchrun-style launch
// (no MPI) exchanges the attention partials over the engines' TCP mesh and
// prints the same digest as one rank, for cp 2 and 4, under pressure with the
// schedule check on; a CP rank that stops inside the exchange makes its peers
// fail within the timeout, naming the exchange and the rank.
func TestHelixUnderTorchrunMatchesSingleRank(t *testing.T) {
	bin := worker(t)
	t.Setenv("TLLM_HELIX_AGG_CHECK_SCHEDULE", "1")
	args := helixPressureArgs(t)
	one := serve(t, bin, append(args, "--cp", "1", "--pages", "64")...)
	for _, cp := range []int{2, 4} {
		out, stderrs, errs, _ := torchrunWorkers(t, bin, cp, nil, append(args, "--report", "json", "--cp", strconv.Itoa(cp),
			"--pages", strconv.Itoa(64/cp))...)
		for r, err := range errs {
			require.NoError(t, err, "rank %d: %s", r, stderrs[r])
		}
		var rep report
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		require.Positive(t, rep.Preemptions.Recompute)
		require.Equal(t, one.OutputDigest, rep.OutputDigest, "torchrun --cp %d and --cp 1 print the same digest", cp)
	}
	_, stderrs, errs, took := torchrunWorkers(t, bin, 2, []string{"LOCKSTEP_TEST_FAULT=stall:1:5"},
		append(args, "--cp", "2", "--pages", "32", "--collective-timeout", "2s")...)
	require.Error(t, errs[0])
	require.Less(t, took, 30*time.Second)
	require.Contains(t, stderrs[0], "engine wait: TIMEOUT")
	require.Contains(t, stderrs[0], "(rank 0 of 2, TCP): timed out after 2000 ms; waiting for rank 1 (last received from it: Helix attention exchange at layer")
}
