//go:build native

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// twinRep is the part of the report the twin tests compare.
type twinRep struct {
	report
	Clock     string                     `json:"clock"`
	DurationS float64                    `json:"duration_s"`
	TTFT      struct{ P50, P90 float64 } `json:"ttft_ms"`
	E2E       struct{ P50, P90 float64 } `json:"e2e_ms"`
}

// TestTwinUnderMPIRunMatchesInProcess (issue 10, item 6): the twin with one
// rank per process (real collectives, the virtual clock agreed through
// them) prints the same digest and the same virtual-time latencies as
// in-process coroutine ranks, on real lengths and real arrival times.
func TestTwinUnderMPIRunMatchesInProcess(t *testing.T) {
	needMPIRun(t)
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	args := []string{"run", "--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--pages", "0",
		"--trace", trace, "--limit", "40", "--report", "json", "--progress", "off"}
	var inproc twinRep
	out := serveRawArgs(t, bin, append(args, "--ranks", "2")...)
	require.NoError(t, json.Unmarshal(out, &inproc))
	require.Equal(t, "virtual", inproc.Clock)
	require.Equal(t, 40, inproc.Requests.Completed)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", append([]string{"--oversubscribe", "-np", "2", bin}, args...)...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	var mpi twinRep
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &mpi), stdout.String())
	require.Equal(t, inproc.OutputDigest, mpi.OutputDigest)
	require.Equal(t, inproc.DurationS, mpi.DurationS)
	require.Equal(t, inproc.TTFT, mpi.TTFT)
	require.Equal(t, inproc.E2E, mpi.E2E)
	require.Equal(t, inproc.LockstepWaste, mpi.LockstepWaste)
}

// serveRawArgs runs the worker with exactly args and returns stdout.
func serveRawArgs(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	return out.Bytes()
}
