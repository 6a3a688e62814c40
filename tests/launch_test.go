package tests

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// launchRanks starts size processes of the test program with torchrun-style
// variables on loopback (the TCP transport and bootstrap store) and waits
// for every rank but those in keepRunning, which it kills afterwards. It
// returns each rank's exit code and the run's directory.
func launchRanks(t *testing.T, bin string, size int, keepRunning map[int]bool, args ...string) ([]int, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	cmds := make([]*exec.Cmd, size)
	outs := make([]*bytes.Buffer, size)
	for r := range size {
		cmd := exec.Command(bin, append([]string{"-out", dir}, args...)...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", size),
			fmt.Sprintf("LOCAL_RANK=%d", r), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", size),
			"MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", port))
		outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
	}
	codes := make([]int, size)
	deadline := time.AfterFunc(60*time.Second, func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	})
	defer deadline.Stop()
	for r, cmd := range cmds {
		if keepRunning[r] {
			continue
		}
		err := cmd.Wait()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exit):
			codes[r] = exit.ExitCode()
		default:
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Logf("rank %d exited %d: %s", r, codes[r], strings.TrimSpace(outs[r].String()))
	}
	for r := range keepRunning {
		cmds[r].Process.Kill()
		cmds[r].Wait()
		codes[r] = -1
	}
	return codes, dir
}

// TestTorchrunLaunch runs four processes of the test program, launched the
// way torchrun does (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), through the
// TCP transport: the collectives work, a mismatch fails every rank with the
// same message, and a rank that stops makes the others fail with a timeout
// report within the timeout.
func TestTorchrunLaunch(t *testing.T) {
	const size = 4
	bin := buildMPIProg(t, "")

	t.Run("ok", func(t *testing.T) {
		codes, dir := launchRanks(t, bin, size, nil, "-scenario", "ok")
		lines, _ := rankResults(t, dir, size)
		for r := range size {
			require.Equal(t, 0, codes[r], "rank %d", r)
			require.True(t, strings.HasPrefix(lines[r], "OK "), "rank %d: %s", r, lines[r])
			require.Equal(t, lines[0], lines[r], "rank %d's trace differs from rank 0's", r)
		}
	})

	// With a job token the store and the transport authenticate every
	// rank (handshake in nccl); the launch works the same.
	t.Run("ok with a job token", func(t *testing.T) {
		t.Setenv("LOCKSTEP_JOB_TOKEN", "launch test token 0123456789abcdef")
		codes, dir := launchRanks(t, bin, size, nil, "-scenario", "ok")
		lines, _ := rankResults(t, dir, size)
		for r := range size {
			require.Equal(t, 0, codes[r], "rank %d", r)
			require.True(t, strings.HasPrefix(lines[r], "OK "), "rank %d: %s", r, lines[r])
		}
	})

	t.Run("mismatch", func(t *testing.T) {
		codes, dir := launchRanks(t, bin, size, nil, "-scenario", "mismatch")
		lines, _ := rankResults(t, dir, size)
		want := fmt.Sprintf(`collective #8 mismatch: rank 0 entered allgather:"batch_size", rank %d entered broadcast:"arrivals"`, size-1)
		for r := range size {
			require.Equal(t, 1, codes[r], "rank %d", r)
			require.Contains(t, lines[r], want, "rank %d", r)
		}
	})

	t.Run("rank stops", func(t *testing.T) {
		timeout := 2 * time.Second
		start := time.Now()
		codes, dir := launchRanks(t, bin, size, map[int]bool{1: true},
			"-scenario", "stop", "-timeout", timeout.String(), "-stop-for", "60s")
		require.Less(t, time.Since(start), 30*time.Second)
		lines, _ := rankResults(t, dir, size)
		checkStopReports(t, lines, timeout)
		for r, code := range codes {
			if r != 1 {
				require.Equal(t, 2, code, "rank %d exits non-zero after the timeout", r)
			}
		}
	})
}

// buildMPIProg builds tests/testdata/mpiprog with the given build tags.
func buildMPIProg(t *testing.T, tags string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mpiprog")
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "./testdata/mpiprog")...).CombinedOutput()
	require.NoError(t, err, "building the test program: %s", out)
	return bin
}

// rankResults reads the per-rank result files (rank-<r>.txt) and, where the
// wrapper got to write them, the exit codes (exit-<r>); missing = -1.
func rankResults(t *testing.T, dir string, size int) (lines []string, exits []int) {
	t.Helper()
	lines, exits = make([]string, size), make([]int, size)
	for r := range size {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.txt", r)))
		lines[r] = strings.TrimSpace(string(b))
		exits[r] = -1
		// An empty file: the wrapper was killed between creating and writing it.
		if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("exit-%d", r))); err == nil {
			if code, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				exits[r] = code
			}
		}
	}
	return lines, exits
}

// checkStopReports checks the timeout report of every rank but the stopped
// rank 1 (shared with the torchrun-style launch test).
func checkStopReports(t *testing.T, lines []string, timeout time.Duration) {
	t.Helper()
	after := regexp.MustCompile(`^ERROR after (\d+)ms: `)
	for r, line := range lines {
		if r == 1 {
			continue
		}
		m := after.FindStringSubmatch(line)
		require.NotNil(t, m, "rank %d: %q", r, line)
		ms, _ := strconv.Atoi(m[1])
		require.GreaterOrEqual(t, ms, int(timeout.Milliseconds()), "rank %d reported before the timeout", r)
		require.Less(t, ms, int((timeout + 3*time.Second).Milliseconds()), "rank %d reported late", r)
		require.Contains(t, line, fmt.Sprintf(`collective #8 allgather:"batch_size" at iteration 2 timed out after %v on rank %d`, timeout, r))
		require.Contains(t, line, `rank 1 last entered allreduce:"init_status" (#7, iteration 1) and returned from it`)
		for p := range lines {
			if p != 1 && p != r {
				require.Contains(t, line, fmt.Sprintf(`rank %d last entered allgather:"batch_size" (#8, iteration 2) and is still in it`, p))
			}
		}
	}
}
