//go:build native

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runExit runs the worker binary and returns its exit code, stdout and stderr.
func runExit(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append([]string{"run", "--progress", "off"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "the run did not finish: %s", errb.String())
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, out.String(), errb.String()
}

// requestRanks reads --requests-out and returns each request's rank.
func requestRanks(t *testing.T, path string) []int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var ranks []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Rank  int
			Error string
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		require.Empty(t, r.Error)
		ranks = append(ranks, r.Rank)
	}
	require.NoError(t, sc.Err())
	return ranks
}

func writeLines(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return p
}

// TestIssue9ScaleCommands: the issue's commands on the real trace finish at
// once with an error naming what was wrong, instead of exhausting memory,
// panicking or printing negative latencies with exit 0.
func TestIssue9ScaleCommands(t *testing.T) {
	bin := worker(t)
	trace := sharedTrace(t, "synthetic_trace.jsonl")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--length-scale", "1e6"}, 1, "none of the 20 requests can ever be served"},
		{[]string{"--length-scale", "1e6"}, 1, "synthetic_trace.jsonl:1: prompt of 40160000000 tokens + max_new_tokens 6000000 exceeds the int32 token range"},
		{[]string{"--length-scale", "1e12"}, 2, "--length-scale must be a finite number in (0, 2147483647], got 1e+12"},
		{[]string{"--length-scale", "1e300"}, 2, "--length-scale must be a finite number in (0, 2147483647], got 1e+300"},
		{[]string{"--length-scale", "0.01", "--arrival-scale", "Inf"}, 2, "--arrival-scale must be a finite number ≥ 0, got +Inf"},
		{[]string{"--length-scale", "0.01", "--arrival-scale", "NaN"}, 2, "--arrival-scale must be a finite number ≥ 0, got NaN"},
		{[]string{"--length-scale", "0.01", "--arrival-scale", "1e300"}, 1,
			`synthetic_trace.jsonl:3: field "timestamp": 40 ms × --arrival-scale 1e+300 is beyond the longest replay`},
	} {
		start := time.Now()
		code, _, stderr := runExit(t, bin, append([]string{"--trace", trace, "--limit", "20", "--report", "json"}, c.args...)...)
		require.Equal(t, c.code, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, "%v", c.args)
		require.Less(t, time.Since(start), 20*time.Second, "%v: the run must fail before any work", c.args)
	}
}

// TestHelixAdmissionUsesTheCPLedger: under Helix the pool is the CP
// group's ledger (pages × page size × cp global tokens); the up-front check
// and the ranks agree on it.
func TestHelixAdmissionUsesTheCPLedger(t *testing.T) {
	bin := worker(t)
	base := []string{"--engine", "cpu", "--cp", "2", "--pages", "4", "--tokens-per-page", "16", "--arrival-scale", "0",
		"--report", "json"}
	const reason = "prompt 121 + max_new_tokens 8 = 129 tokens can never fit the KV pool of 128 tokens (4 pages × 32)"
	fits := `{"timestamp": 0, "input_length": 120, "output_length": 8, "hash_ids": [1]}`
	over := `{"timestamp": 0, "input_length": 121, "output_length": 8, "hash_ids": [2]}`

	out := filepath.Join(t.TempDir(), "req.jsonl")
	code, stdout, stderr := runExit(t, bin, append(base, "--trace", writeLines(t, fits, over), "--requests-out", out)...)
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Requests   struct{ Completed, Rejected int }
		Rejections []struct {
			Index  int
			Reason string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Equal(t, 1, rep.Requests.Completed)
	require.Equal(t, 1, rep.Requests.Rejected)
	require.Equal(t, reason, rep.Rejections[0].Reason)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(b), `"rank":-1`, "a request rejected on arrival was never placed")

	code, _, stderr = runExit(t, bin, append(base, "--trace", writeLines(t, over))...)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "t.jsonl:1: "+reason)
}

// TestRoutingFieldsUnderMPIRun: the routing fields travel in the arrival
// broadcast between processes, so one rank per process places every
// request exactly where in-process ranks do (pins, strict and relaxed,
// and a shared affinity id under the conversation-aware router).
func TestRoutingFieldsUnderMPIRun(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	trace := writeLines(t,
		`{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 11], "conversation_id": "A1", "affinity_id": "P"}`,
		`{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [5], "attention_dp_rank": 1, "attention_dp_relax": false}`,
		`{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [6], "attention_dp_rank": 1}`,
		`{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [2], "conversation_id": "B"}`,
		`{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [1], "conversation_id": "A2", "affinity_id": "P"}`,
		`{"timestamp": 0, "input_length": 1200, "output_length": 4, "hash_ids": [1, 11, 12], "conversation_id": "A1", "affinity_id": 12}`,
	)
	args := []string{"--engine", "cpu", "--router", "conversation", "--trace", trace, "--arrival-scale", "0", "--report", "json"}
	inproc := filepath.Join(t.TempDir(), "in.jsonl")
	code, _, stderr := runExit(t, bin, append(args, "--ranks", "2", "--requests-out", inproc)...)
	require.Equal(t, 0, code, stderr)
	want := requestRanks(t, inproc)
	require.Equal(t, 1, want[1], "strict pin")
	require.Equal(t, want[0], want[4], "A2 shares affinity P with A1")

	mp := filepath.Join(t.TempDir(), "mp.jsonl")
	out, err := mpirunWorker(t, bin, 2, nil, append(args, "--requests-out", mp)...)
	require.NoError(t, err, out)
	require.Equal(t, want, requestRanks(t, mp))
}
