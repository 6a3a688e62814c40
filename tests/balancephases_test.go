//go:build native

package tests

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBalancePhasesScript: scripts/balance-phases.py, run on the iteration
// logs of every rank of a twin run under attention DP, reads the same
// whole-run token balance as the run's report (balance.token_ratio), and
// prints a prompt window and five fifths.
func TestBalancePhasesScript(t *testing.T) {
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "the repository's scripts need python3 (README: setup)")
	bin := worker(t)
	dir := t.TempDir()
	logs := filepath.Join(dir, "il_{rank}.jsonl")
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	rep := serve(t, bin, "--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--ranks", "4", "--pages", "0",
		"--trace", sharedTrace(t, "conversation_trace.jsonl"), "--limit", "300", "--iter-log", logs)
	require.NotNil(t, rep.Balance)
	out, err := exec.Command(py, "../scripts/balance-phases.py", logs).CombinedOutput()
	require.NoError(t, err, string(out))
	m := regexp.MustCompile(`whole run: token balance ([0-9.]+)`).FindSubmatch(out)
	require.NotNil(t, m, string(out))
	whole, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	require.InDelta(t, rep.Balance.TokenRatio, whole, 0.0006, "script %.3f, report %.4f\n%s", whole, rep.Balance.TokenRatio, out)
	require.Regexp(t, `prompt window \(iterations \d+-\d+, \d+ of \d+\): token balance [0-9.]+`, string(out))
	for q := 1; q <= 5; q++ {
		require.Regexp(t, fmt.Sprintf(`(?m)^ +%d +[0-9.]+ `, q), string(out))
	}
	bad, err := exec.Command(py, "../scripts/balance-phases.py", filepath.Join(dir, "none_{rank}.jsonl")).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(bad), "0 rank log(s); the balance needs two or more")
}
