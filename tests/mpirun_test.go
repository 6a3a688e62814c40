//go:build native

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mpiRanks is the world size of the mpirun tests.
const mpiRanks = 4

// runMPI runs the program under mpirun -np mpiRanks, each rank wrapped in a
// shell that records its exit code, and returns mpirun's output, the run's
// directory and mpirun's error.
func runMPI(t *testing.T, bin string, args ...string) (string, string, error) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	wrapper := `"$0" "$@"; echo $? > "` + dir + `/exit-$OMPI_COMM_WORLD_RANK"`
	cmdArgs := append([]string{"--oversubscribe", "-np", strconv.Itoa(mpiRanks), "sh", "-c", wrapper,
		bin, "-out", dir}, args...)
	cmd := exec.CommandContext(ctx, "mpirun", cmdArgs...)
	// As root (CI containers) mpirun refuses to start without these.
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "mpirun did not finish: %s", out)
	return string(out), dir, err
}

// needMPIRun skips the test when Open MPI's launcher is missing (CI
// installs it with scripts/ensure-deps.sh).
func needMPIRun(t *testing.T) {
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev, or scripts/ensure-deps.sh)")
	}
}

// TestMPIRun: four processes under mpirun meet in allgather, broadcast and
// allreduce through the MPI transport; every result is checked in the
// program, and every rank's collective trace has the same digest.
func TestMPIRun(t *testing.T) {
	needMPIRun(t)
	bin := buildMPIProg(t, "native")
	out, dir, err := runMPI(t, bin, "-scenario", "ok")
	require.NoError(t, err, out)
	requireRanksAgree(t, dir, out)
}

// requireRanksAgree requires that every rank of an mpiprog run exited 0
// with "OK" and the same trace digest as rank 0.
func requireRanksAgree(t *testing.T, dir, out string) {
	t.Helper()
	lines, exits := rankResults(t, dir, mpiRanks)
	for r := range mpiRanks {
		require.Equal(t, 0, exits[r], "rank %d exit code; output:\n%s", r, out)
		require.True(t, strings.HasPrefix(lines[r], "OK "), "rank %d: %s", r, lines[r])
		require.Equal(t, lines[0], lines[r], "rank %d's trace differs from rank 0's", r)
	}
}

// TestMPIRunIdleDoorbell: between iterations the ranks meet at the idle
// doorbell (eng_comm_idle_wait): the ranks other than rank 0 wait for its
// ring asleep, give up at their timeout, and drop a ring that came after
// they gave up (checked in the program); the collectives around it still
// pair (same trace digest on every rank).
func TestMPIRunIdleDoorbell(t *testing.T) {
	needMPIRun(t)
	bin := buildMPIProg(t, "native")
	out, dir, err := runMPI(t, bin, "-scenario", "idle", "-iterations", "4")
	require.NoError(t, err, out)
	requireRanksAgree(t, dir, out)
}

// TestMPIRunMismatch: the last rank enters a broadcast where the others
// enter an allgather; every rank exits non-zero with the same message.
func TestMPIRunMismatch(t *testing.T) {
	needMPIRun(t)
	bin := buildMPIProg(t, "native")
	out, dir, _ := runMPI(t, bin, "-scenario", "mismatch")
	lines, exits := rankResults(t, dir, mpiRanks)
	want := fmt.Sprintf(`collective #8 mismatch: rank 0 entered allgather:"batch_size", rank %d entered broadcast:"arrivals"`, mpiRanks-1)
	for r := range mpiRanks {
		require.Equal(t, 1, exits[r], "rank %d exit code; output:\n%s", r, out)
		require.Contains(t, lines[r], want, "rank %d", r)
	}
}

// TestMPIRunRankStops: rank 1 stops at iteration 2; every other rank reports
// a timeout naming the collective, the iteration and every peer's last entry
// within the timeout, and the job ends long before the stopped rank would
// have woken up.
func TestMPIRunRankStops(t *testing.T) {
	needMPIRun(t)
	bin := buildMPIProg(t, "native")
	timeout := 2 * time.Second
	start := time.Now()
	out, dir, err := runMPI(t, bin, "-scenario", "stop", "-timeout", timeout.String(), "-stop-for", "60s")
	elapsed := time.Since(start)
	require.Error(t, err, "mpirun must fail when ranks exit on a timeout; output:\n%s", out)
	require.Less(t, elapsed, 30*time.Second, "the job waited for the stopped rank")
	lines, exits := rankResults(t, dir, mpiRanks)
	checkStopReports(t, lines, timeout)
	for r, code := range exits {
		// Ranks the launcher killed after the first exit wrote no code.
		require.Contains(t, []int{-1, 2}, code, "rank %d exit code; output:\n%s", r, out)
	}
}
