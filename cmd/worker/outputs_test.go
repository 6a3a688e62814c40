package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUnwritableOutputsRefusedBeforeServing (defect 8): every output path is
// opened before any work, so a path that cannot be written fails the run at
// once, naming the flag and the path.
func TestUnwritableOutputsRefusedBeforeServing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir", "out.jsonl")
	for _, flag := range []string{"--requests-out", "--iter-log", "--kv-events"} {
		code, stdout, stderr := runCLI(t, append(append([]string{}, fakeRun...), flag, missing)...)
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, flag+` "`+missing+`" cannot be written`)
		require.Contains(t, stderr, "no such file or directory")
		require.NotContains(t, stderr, "serving", "refused before any work")
		require.Empty(t, stdout)
	}
	// Every rank's iteration log path is opened: rank 2's is the bad one.
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "it-2.jsonl"), 0o755)) // a directory where rank 2's file goes
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "4", "--iter-log", filepath.Join(dir, "it-{rank}.jsonl"))...)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `--iter-log "`+filepath.Join(dir, "it-2.jsonl")+`" cannot be written`)
	require.NotContains(t, stderr, "serving")
}

// TestFailedOutputStillPrintsTheReport (defect 8): a write that fails during
// or after the run (here: a full device) does not lose the results: the
// report is printed, then the worker exits non-zero naming the flag and
// the path.
func TestFailedOutputStillPrintsTheReport(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	for _, flag := range []string{"--requests-out", "--iter-log", "--kv-events"} {
		code, stdout, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--report", "json", flag, "/dev/full")...)
		require.Equal(t, 1, code, stderr)
		var rep map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep), "the report is printed: %q", stdout)
		require.EqualValues(t, 8, field(rep, "requests.completed"))
		require.Contains(t, stderr, "the run finished (report printed) but an output is incomplete: "+flag+": writing /dev/full failed")
		require.Contains(t, stderr, "no space left on device")
		if flag != "--requests-out" { // written during the run: one warning when it fails
			require.Equal(t, 1, strings.Count(stderr, "the run goes on, the file is incomplete"), stderr)
		}
	}
}

// TestOutputsWritten: the outputs hold what they should when all is well,
// with several ranks sharing one iteration log file.
func TestOutputsWritten(t *testing.T) {
	dir := t.TempDir()
	reqs, iters, events := filepath.Join(dir, "r.jsonl"), filepath.Join(dir, "it.jsonl"), filepath.Join(dir, "ev.jsonl")
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "2", "--requests-out", reqs,
		"--iter-log", iters, "--kv-events", events)...)
	require.Equal(t, 0, code, stderr)
	b, err := os.ReadFile(reqs)
	require.NoError(t, err)
	require.Equal(t, 8, strings.Count(string(b), "\n"))
	b, err = os.ReadFile(iters)
	require.NoError(t, err)
	require.Contains(t, string(b), `"rank":0`)
	require.Contains(t, string(b), `"rank":1`)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		require.True(t, json.Valid([]byte(line)), "whole records, never interleaved: %q", line)
	}
	b, err = os.ReadFile(events)
	require.NoError(t, err)
	require.NotEmpty(t, b)
}

// TestADPConfigWithoutAttentionDPWarns: attention_dp_config's modes on a
// run without attention DP (one rank) are ignored, as TensorRT-LLM ignores
// them, with one warning naming where they were set; on two ranks no
// warning.
func TestADPConfigWithoutAttentionDPWarns(t *testing.T) {
	code, stdout, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--report", "json", "--ranks", "1",
		"--attention-dp-balance", "--attention-dp-cost-leveling")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "--attention-dp-balance and --attention-dp-cost-leveling: no effect without attention DP")
	require.Equal(t, 1, strings.Count(stderr, "no effect without attention DP"), stderr)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.EqualValues(t, 8, field(rep, "requests.completed"))

	code, _, stderr = runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "2", "--attention-dp-balance")...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "no effect without attention DP")
}

// TestRouterConfigWithoutConversationRouterWarns: the conversation
// router's placement and load-balance weight on a run of the default
// router are ignored with one warning naming where they were set; with
// --router conversation, none.
func TestRouterConfigWithoutConversationRouterWarns(t *testing.T) {
	code, _, stderr := runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "2",
		"--new-conv-placement", "least_prefill", "--load-balance-weight", "1")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, `--new-conv-placement and --load-balance-weight: read by the conversation router only (--router is "default"`)
	require.Equal(t, 1, strings.Count(stderr, "read by the conversation router only"), stderr)

	code, _, stderr = runCLI(t, append(append([]string{}, fakeRun...), "--ranks", "2", "--router", "conversation",
		"--new-conv-placement", "least_prefill", "--load-balance-weight", "1")...)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "read by the conversation router only")
}

// TestOutputOverAnInputRefused: an output path that is one of the run's
// inputs (here the trace, also through a symbolic link) would destroy it
// when opened for writing; two outputs on one file would truncate each
// other. Both are refused before any work, naming the flags, and the input
// is untouched.
func TestOutputOverAnInputRefused(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	body := []byte(`{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}` + "\n")
	require.NoError(t, os.WriteFile(trace, body, 0o644))
	link := filepath.Join(dir, "link.jsonl")
	require.NoError(t, os.Symlink(trace, link))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", trace, "--requests-out", trace}, `--requests-out "` + trace + `" is the file --trace reads`},
		{[]string{"--trace", trace, "--cpuprofile", link}, `--cpuprofile "` + link + `" is the file --trace reads`},
		{[]string{"--trace", trace, "--iter-log", trace}, `--iter-log "` + trace + `" is the file --trace reads`},
		{[]string{"--requests-out", filepath.Join(dir, "x"), "--kv-events", filepath.Join(dir, "x")},
			`--requests-out and --kv-events both write "` + filepath.Join(dir, "x") + `"`},
	} {
		code, stdout, stderr := runCLI(t, append(append([]string{}, fakeRun...), c.args...)...)
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, c.want)
		require.NotContains(t, stderr, "serving", "refused before any work")
		require.Empty(t, stdout)
		got, err := os.ReadFile(trace)
		require.NoError(t, err)
		require.Equal(t, body, got, "the trace is untouched")
	}
}

// A run refused for its workload (a malformed trace, or requests none of
// which the configuration can serve) opens no output: the iteration log,
// per-request file and KV events of an earlier run stay as they were
// (before, they were truncated before the trace was read).
func TestRefusedWorkloadKeepsEarlierOutputs(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1]}`+"\n"), 0o644))
	never := filepath.Join(dir, "never.jsonl")
	require.NoError(t, os.WriteFile(never, []byte(`{"timestamp": 0, "input_length": 2000, "output_length": 4, "hash_ids": [1, 2, 3, 4]}`+"\n"), 0o644))
	outs := []string{"--iter-log", filepath.Join(dir, "iter.jsonl"), "--requests-out", filepath.Join(dir, "req.jsonl"),
		"--kv-events", filepath.Join(dir, "kv.jsonl")}
	for i := 1; i < len(outs); i += 2 {
		require.NoError(t, os.WriteFile(outs[i], []byte("an earlier run's output\n"), 0o644))
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", bad}, `field "hash_ids" has 1 blocks but input_length 3000 needs`},
		{[]string{"--trace", never, "--pages", "1", "--tokens-per-page", "4"}, "can ever be served"},
	} {
		code, _, stderr := runCLI(t, append(append(append([]string{}, fakeRun...), c.args...), outs...)...)
		require.NotEqual(t, 0, code, stderr)
		require.Contains(t, stderr, c.want)
		for i := 1; i < len(outs); i += 2 {
			got, err := os.ReadFile(outs[i])
			require.NoError(t, err)
			require.Equal(t, "an earlier run's output\n", string(got), "%s is untouched", outs[i-1])
		}
	}
}
