//go:build native

package tests

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// failRun runs the worker expecting a non-zero exit and returns its stderr
// and how long it took.
func failRun(t *testing.T, bin string, env []string, args ...string) (string, time.Duration) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, append([]string{"run", "--progress", "off", "--arrival-scale", "0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the run must fail; stdout: %s", out.String())
	require.NotEqual(t, 0, ee.ExitCode())
	return errb.String(), took
}

// TestFaultInitFailureAbortsEveryRank: one rank's initialisation fails; the
// vote makes every rank fail before any loop collective, with the cause.
func TestFaultInitFailureAbortsEveryRank(t *testing.T) {
	bin := worker(t)
	stderr, _ := failRun(t, bin, []string{"LOCKSTEP_TEST_FAULT=init:2"}, "--engine", "cpu", "--ranks", "4")
	require.Contains(t, stderr, "rank 2: injected initialisation failure")
	require.Contains(t, stderr, "rank 0: KV cache manager initialisation failed on another rank")
	require.Contains(t, stderr, "rank 3: KV cache manager initialisation failed on another rank")
}

// TestFaultStoppedRankTimesOut: a rank stops entering collectives; the
// others exit within the collective timeout, naming the collective, the
// iteration and what every peer last entered.
func TestFaultStoppedRankTimesOut(t *testing.T) {
	bin := worker(t)
	stderr, took := failRun(t, bin, []string{"LOCKSTEP_TEST_FAULT=stop:1:3"}, "--engine", "cpu", "--ranks", "3",
		"--collective-timeout", "2s", "--length-scale", "0.25")
	require.Less(t, took, 30*time.Second)
	require.Contains(t, stderr, "iteration 3")
	require.Contains(t, stderr, `allgather:"batch_size" timed out after 2s`)
	require.Contains(t, stderr, "rank 1 last entered")
	// The first line of the error names the rank where the failure began
	// (the stopped one), not the first peer whose watchdog fired.
	_, errText, found := strings.Cut(stderr, "worker run: ")
	require.True(t, found, stderr)
	first, _, _ := strings.Cut(errText, "\n")
	require.Equal(t, "rank 1 iteration 3: injected fault: rank 1 stopped at iteration 3", first)
}
