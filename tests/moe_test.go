//go:build native

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// moeReport is the part of the worker's JSON report the MoE tests read.
type moeReport struct {
	report
	MoEWaitMS    *float64 `json:"moe_wait_ms"`
	MoEWaitShare *float64 `json:"moe_wait_share"`
}

func moeServe(t *testing.T, bin string, args ...string) moeReport {
	t.Helper()
	var rep moeReport
	out := serveRaw(t, bin, args...)
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	return rep
}

// moeArgs is the command: moe-tiny on 200 conversation requests.
func moeArgs(t *testing.T) []string {
	return []string{"--engine", "cpu", "--model", "moe-tiny", "--trace", sharedTrace(t, "conversation_trace.jsonl"),
		"--limit", "200", "--length-scale", "0.01"}
}

// TestMoEDigestIndependentOfExpertParallelism: moe-tiny served on 1, 2 and 4
// in-process attention-DP ranks (the experts dealt over them, tokens
// dispatched and combined inside every step), on 2 Helix CP ranks (every
// expert on each) and under `mpirun -np 4` (MPI exchange groups) prints one
// digest; with more than one rank the ranks wait in MoE exchanges, which the
// report and every iteration-log record show; a dense model's log has no
// moe_wait_ms.
func TestMoEDigestIndependentOfExpertParallelism(t *testing.T) {
	bin := worker(t)
	args := moeArgs(t)
	one := moeServe(t, bin, append(args, "--ranks", "1", "--overlap", "off")...)
	require.Equal(t, 200, one.Requests.Completed)
	require.Len(t, one.OutputDigest, 64)
	require.NotNil(t, one.MoEWaitMS)
	require.Zero(t, *one.MoEWaitMS, "one rank has no peers to wait for")
	dir := t.TempDir()
	for _, ranks := range []string{"2", "4"} {
		log := filepath.Join(dir, "iter-"+ranks+".{rank}.jsonl")
		t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
		rep := moeServe(t, bin, append(args, "--ranks", ranks, "--iter-log", log)...)
		require.Equal(t, one.OutputDigest, rep.OutputDigest, "--ranks %s and --ranks 1 print the same digest", ranks)
		require.Positive(t, *rep.MoEWaitMS, "--ranks %s", ranks)
		require.Greater(t, *rep.MoEWaitShare, 0.0)
		require.Less(t, *rep.MoEWaitShare, 1.0)
		records := 0
		for _, rank := range []string{"0", "1"} {
			f, err := os.Open(strings.Replace(log, "{rank}", rank, 1))
			require.NoError(t, err)
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var rec struct {
					DeviceMS  *float64 `json:"device_ms"`
					MoEWaitMS *float64 `json:"moe_wait_ms"`
				}
				require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
				if rec.DeviceMS == nil {
					continue // no forward this iteration
				}
				require.NotNil(t, rec.MoEWaitMS, "a forward's record has moe_wait_ms: %s", sc.Text())
				require.LessOrEqual(t, *rec.MoEWaitMS, *rec.DeviceMS+0.001)
				records++
			}
			f.Close()
		}
		require.Positive(t, records)
	}
	helix := moeServe(t, bin, append(args, "--cp", "2")...)
	require.Equal(t, one.OutputDigest, helix.OutputDigest, "--cp 2 (every expert on each CP rank) and --ranks 1")

	dense := filepath.Join(dir, "dense.jsonl")
	serve(t, bin, "--engine", "cpu", "--ranks", "2", "--limit", "8", "--iter-log", dense)
	b, err := os.ReadFile(strings.Replace(dense, "{rank}", "0", 1))
	require.NoError(t, err)
	require.NotContains(t, string(b), "moe_wait_ms", "a dense model's log is unchanged")

	t.Run("mpirun -np 4", func(t *testing.T) {
		needMPIRun(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		full := append([]string{"--oversubscribe", "-np", "4", bin, "run", "--report", "json", "--progress", "off",
			"--arrival-scale", "0"}, args...)
		cmd := exec.CommandContext(ctx, "mpirun", full...)
		cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		require.NoError(t, cmd.Run(), errb.String())
		var rep moeReport
		require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "exactly one report (rank 0's) on stdout: %s", out.String())
		require.Equal(t, 4, rep.Ranks)
		require.Equal(t, 200, rep.Requests.Completed)
		require.Equal(t, one.OutputDigest, rep.OutputDigest, "mpirun -np 4 and --ranks 1 print the same digest")
		require.Positive(t, *rep.MoEWaitMS, "the fleet's wait is gathered from every process")
	})
	t.Run("torchrun-style, 2 processes (TCP exchange)", func(t *testing.T) {
		out, stderrs, errs, _ := torchrunWorkers(t, bin, 2, nil, append(args, "--report", "json")...)
		for r, err := range errs {
			require.NoError(t, err, "rank %d: %s", r, stderrs[r])
		}
		var rep moeReport
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		require.Equal(t, 200, rep.Requests.Completed)
		require.Equal(t, one.OutputDigest, rep.OutputDigest, "torchrun-style 2 processes and --ranks 1 print the same digest")
		require.Positive(t, *rep.MoEWaitMS)
	})
}

// TestMoEStoppedRankInsideExchange: rank 1's engine stops at layer 1's MoE
// dispatch for five collective timeouts; every other rank fails within the
// collective timeout naming the layer and the exchange (and the peer it
// waits for), in-process and under mpirun.
func TestMoEStoppedRankInsideExchange(t *testing.T) {
	bin := worker(t)
	args := append(moeArgs(t), "--limit", "50", "--collective-timeout", "2s")
	stderr, _ := failRun(t, bin, []string{"LOCKSTEP_TEST_FAULT=moe-stop:1:3:1"}, append(args, "--ranks", "3")...)
	_, errText, found := strings.Cut(stderr, "worker run: ")
	require.True(t, found, stderr)
	// Rank 0 or 2 times out first waiting for rank 1, the other sees the
	// group aborted (as does rank 1 when it wakes); every rank names the
	// exchange and its layer.
	require.Contains(t, errText, "timed out after 2000 ms; waiting for member 1 (last entered MoE combine exchange at layer 0")
	for _, r := range []string{"rank 0 iteration", "rank 1 iteration", "rank 2 iteration"} {
		i := strings.Index(errText, r)
		require.GreaterOrEqual(t, i, 0, "%s fails: %s", r, stderr)
		line, _, _ := strings.Cut(errText[i:], "\n")
		require.Contains(t, line, "MoE dispatch exchange at layer 1", line)
	}

	t.Run("mpirun -np 3", func(t *testing.T) {
		needMPIRun(t)
		start := time.Now()
		out, err := mpirunWorker(t, bin, 3, []string{"LOCKSTEP_TEST_FAULT=moe-stop:1:3:1"}, args[2:]...)
		require.Error(t, err)
		// The stopped rank stalls five timeouts (10 s); its peers leave at 2 s.
		require.Less(t, time.Since(start), 9*time.Second, out)
		require.Contains(t, out, "MoE dispatch exchange at layer 1")
		require.Contains(t, out, "timed out after 2000 ms; waiting for rank 1 (last received from it: MoE combine exchange at layer 0")
	})
}

// TestMoEGuards: start-up refusals name what is wrong, before any work.
func TestMoEGuards(t *testing.T) {
	bin := worker(t)
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		// CI's engine library has no CUDA backend: that is said first (fleet's
		// TestCUDAEngineGuards checks the NCCL refusal with CUDA present).
		{nil, []string{"--engine", "cuda", "--model", "moe-tiny", "--ranks", "2"}, "--engine cuda: this engine library was built without the CUDA backend"},
		{[]string{"LOCKSTEP_TEST_FAULT=moe-stop:1:3:1"}, []string{"--ranks", "2"}, "needs a MoE model"},
		{[]string{"LOCKSTEP_TEST_FAULT=moe-stop:1:3:7"}, []string{"--model", "moe-tiny", "--ranks", "2"}, "layer 7 is outside the model's 3 layers"},
		{[]string{"LOCKSTEP_TEST_FAULT=moe-stop:1:3"}, []string{"--model", "moe-tiny", "--ranks", "2"}, "moe-stop takes 4 fields"},
	} {
		stderr, _ := failRun(t, bin, c.env, c.args...)
		require.Contains(t, stderr, c.want)
		require.NotContains(t, stderr, "serving", "refused before any work")
	}
}

// TestMLADigestIndependentOfParallelism: deepseek-tiny (latent attention, a
// leading dense layer, grouped sigmoid routing, a shared expert) served on 1,
// 2 and 4 attention-DP ranks (experts dealt over them), on 2 Helix CP ranks
// (latent partials merged across them), with small prefill chunks, and with
// a page pool small enough to preempt, prints one digest.
func TestMLADigestIndependentOfParallelism(t *testing.T) {
	bin := worker(t)
	args := []string{"--engine", "cpu", "--model", "deepseek-tiny", "--trace", sharedTrace(t, "synthetic_trace.jsonl"),
		"--limit", "120", "--length-scale", "0.01"}
	one := moeServe(t, bin, append(args, "--ranks", "1")...)
	require.Equal(t, 120, one.Requests.Completed)
	require.Len(t, one.OutputDigest, 64)
	for _, extra := range [][]string{{"--ranks", "2"}, {"--ranks", "4"}, {"--cp", "2"},
		{"--ranks", "2", "--max-num-tokens", "48"}, {"--ranks", "2", "--pages", "40", "--tokens-per-page", "16", "--max-num-tokens", "256"}} {
		rep := moeServe(t, bin, append(args, extra...)...)
		require.Equal(t, 120, rep.Requests.Completed, "%v", extra)
		require.Equal(t, one.OutputDigest, rep.OutputDigest, "%v and --ranks 1 print the same digest", extra)
		if extra[0] == "--ranks" && extra[1] != "1" {
			require.Positive(t, *rep.MoEWaitMS, "%v: the ranks exchange tokens with their experts", extra)
		}
		if slices.Contains(extra, "--pages") {
			require.Positive(t, rep.Preemptions.Recompute, "%v: the 640-token pool forces recompute preemption", extra)
		}
	}
}
