package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/stretchr/testify/require"
)

// writeConfig writes a YAML config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// runCLI runs the worker's command line in-process and returns the exit
// status, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// fakeRun is a run of the fake engine on the built-in sample, small.
var fakeRun = []string{"run", "--progress", "off", "--arrival-scale", "0", "--engine", "fake", "--length-scale", "0.05", "--limit", "8"}

// requireUserFacing fails when msg shows a Go internal.
func requireUserFacing(t *testing.T, msg string) {
	t.Helper()
	require.Empty(t, usage.Unreadable(msg), "an error: %s", msg)
}

// TestEvalFlagsRefused: `worker eval` refuses a bad sweep, configuration,
// model or objective before any run, naming the flag (exit status 2).
func TestEvalFlagsRefused(t *testing.T) {
	base := []string{"eval", "--trace", "t.jsonl", "--out", t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sweep", "0.3,abc"}, `--sweep: "abc" is not a number`},
		{[]string{"--sweep", "0.9,0.3"}, "--sweep: the loads must ascend"},
		{[]string{"--configs", "A,Q"}, `--configs: unknown configuration "Q"`},
		{[]string{"--model", "deepseek-v3,gpt-5"}, `unknown model "gpt-5"`},
		{[]string{"--slo-ttft", "-1s"}, "--slo-ttft and --slo-tpot must be positive"},
		{[]string{"--jobs", "0"}, "--jobs must be at least 1"},
		{[]string{"--arrivals", "bursts"}, `--arrivals must be trace or poisson, got "bursts"`},
	} {
		code, _, stderr := runCLI(t, append(slices.Clone(base), tc.args...)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, tc.args)
		requireUserFacing(t, stderr)
	}
}

// TestIdlePollRefused: --idle-poll out of [0, 1s] is refused before any
// rank starts, naming the flag, by run and by serve.
func TestIdlePollRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--engine", "fake", "--progress", "off", "--idle-poll", "-1ms"}, "--idle-poll must be between 0 (off) and 1s, got -1ms"},
		{[]string{"serve", "--engine", "fake", "--http", "127.0.0.1:0", "--idle-poll", "2s"}, "--idle-poll must be between 0 (off) and 1s, got 2s"},
	} {
		code, _, stderr := runCode(tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, tc.args)
	}
}

// TestToolFlagsRefused: serve's tool-calling flags go together and name a
// parser it has; --chat-template needs a checkpoint's tokenizer.
func TestToolFlagsRefused(t *testing.T) {
	serve := []string{"serve", "--engine", "fake", "--http", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(slices.Clone(serve), "--enable-auto-tool-choice"), "--enable-auto-tool-choice needs --tool-call-parser (deepseek_v3, deepseek_v31, glm45, glm47, hermes, llama3_json, mistral, pythonic)"},
		{append(slices.Clone(serve), "--enable-auto-tool-choice", "--tool-call-parser", "granite"), `--tool-call-parser must be one of deepseek_v3, deepseek_v31, glm45, glm47, hermes, llama3_json, mistral, pythonic, got "granite"`},
		{append(slices.Clone(serve), "--reasoning-parser", "granite"), `--reasoning-parser must be one of deepseek_r1, glm45, qwen3, got "granite"`},
		{append(slices.Clone(serve), "--tool-call-parser", "hermes"), "which needs --enable-auto-tool-choice too"},
		{append(slices.Clone(serve), "--chat-template", "{{ messages }}"), "--chat-template needs a checkpoint with a tokenizer; --model tiny is a synthetic preset"},
	} {
		code, _, stderr := runCode(tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, tc.args)
	}
}
