//go:build native

package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// workerBuild is the worker binary of this test binary, built once: ~30
// tests run it, and a cgo link takes seconds each time.
var workerBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
}

// TestMain removes the shared worker binary after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if workerBuild.dir != "" {
		os.RemoveAll(workerBuild.dir)
	}
	os.Exit(code)
}

// worker returns bin/worker (native engine), built once per test binary.
func worker(t *testing.T) string {
	t.Helper()
	b := &workerBuild
	b.once.Do(func() {
		// The engine library's hash in the link, as the Makefile does: Go
		// does not notice a rebuilt libengine.a by itself.
		lib, err := os.ReadFile("../build/native/libengine.a")
		if err != nil {
			b.err = fmt.Errorf("build the engine first (make native): %w", err)
			return
		}
		if b.dir, b.err = os.MkdirTemp("", "lockstep-tests-worker-"); b.err != nil {
			return
		}
		b.bin = filepath.Join(b.dir, "worker")
		stamp := fmt.Sprintf("-X github.com/lockstep-ai/lockstep/bridge/native.EngineLibrary=%x", sha256.Sum256(lib))
		cmd := exec.Command("go", "build", "-tags", "native", "-ldflags", stamp, "-o", b.bin, "../cmd/worker")
		b.out, b.err = cmd.CombinedOutput()
	})
	require.NoError(t, b.err, string(b.out))
	return b.bin
}

func sharedTrace(t *testing.T, name string) string {
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "shared", "data", "mooncake", name)
	_, err := os.Stat(p)
	require.NoError(t, err, "the Mooncake traces are expected in ../shared/data/mooncake beside the repository")
	return p
}

type report struct {
	Requests struct {
		Total, Completed, Rejected int
	}
	Tokens struct {
		Prompt, Generated int
	}
	Ranks         int
	OutputDigest  string  `json:"output_digest"`
	LockstepWaste float64 `json:"lockstep_waste"`
	Iterations    int
	Balance       *struct {
		TokenRatio float64 `json:"token_ratio"`
		Held       int64   `json:"adp_balance_held_iterations"`
		Leveled    int64   `json:"cost_leveling_deferred_iterations"`
	}
	Preemptions struct {
		Suspended, Recompute int
	}
}

func serve(t *testing.T, bin string, args ...string) report {
	t.Helper()
	out := serveRaw(t, bin, args...)
	var rep report
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	return rep
}

// serveRaw runs `worker run --report json` and returns the report's bytes.
func serveRaw(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, append([]string{"run", "--report", "json", "--progress", "off", "--arrival-scale", "0"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	return out.Bytes()
}

// TestTraceEndToEndCPUEngine serves the first 120 requests of the synthetic
// Mooncake trace on the CPU engine: every request completes, the digest is
// reproducible, and it does not depend on the number of ranks.
func TestTraceEndToEndCPUEngine(t *testing.T) {
	bin := worker(t)
	trace := sharedTrace(t, "synthetic_trace.jsonl")
	args := []string{"--engine", "cpu", "--trace", trace, "--limit", "120", "--length-scale", "0.01"}
	four := serve(t, bin, append(args, "--ranks", "4")...)
	require.Equal(t, 120, four.Requests.Total)
	require.Equal(t, 120, four.Requests.Completed)
	require.Zero(t, four.Requests.Rejected)
	require.Len(t, four.OutputDigest, 64)
	again := serve(t, bin, append(args, "--ranks", "4")...)
	require.Equal(t, four.OutputDigest, again.OutputDigest, "a second run prints the same digest")
	one := serve(t, bin, append(args, "--ranks", "1", "--overlap", "off")...)
	require.Equal(t, four.OutputDigest, one.OutputDigest, "--ranks 1 (non-overlap loop) and --ranks 4 (overlap loop) print the same digest")
	threads := serve(t, bin, append(args, "--ranks", "2", "--cpu-threads", "3")...)
	require.Equal(t, four.OutputDigest, threads.OutputDigest, "3 CPU engine threads per rank print the same digest")
	// A pool small enough to force recompute preemption keeps the digest.
	tight := serve(t, bin, append(args, "--ranks", "2", "--pages", "40", "--tokens-per-page", "16", "--max-num-tokens", "256")...)
	require.Positive(t, tight.Preemptions.Recompute, "the 640-token pool should force recompute preemption")
	require.Equal(t, four.OutputDigest, tight.OutputDigest, "recompute preemption must not change outputs")
}

// TestCPUThreadsRefused: a thread count outside 0..1024, or an unknown
// kernel set, is refused before any work, naming the flag and what is
// allowed.
func TestCPUThreadsRefused(t *testing.T) {
	bin := worker(t)
	for _, v := range []string{"-1", "1025"} {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, "run", "--engine", "cpu", "--cpu-threads", v, "--progress", "off")
		cmd.Stdout, cmd.Stderr = &out, &errb
		require.Error(t, cmd.Run(), "--cpu-threads %s was accepted", v)
		require.Contains(t, errb.String(), "--cpu-threads must be in 0..1024")
		require.NotContains(t, errb.String(), "serving", "refused before any work")
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, "run", "--engine", "cpu", "--cpu-kernels", "fast", "--progress", "off")
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.Error(t, cmd.Run())
	require.Contains(t, errb.String(), `--cpu-kernels "fast" is not allowed (allowed: exact, quant)`)
}

// TestBuiltInSampleCPUEngine is README command 1 in miniature.
func TestBuiltInSampleCPUEngine(t *testing.T) {
	bin := worker(t)
	rep := serve(t, bin, "--engine", "cpu", "--ranks", "4", "--length-scale", "0.25")
	require.Equal(t, 64, rep.Requests.Completed)
	require.Positive(t, rep.Tokens.Generated)
	fake := serve(t, bin, "--engine", "fake", "--ranks", "4", "--length-scale", "0.25")
	require.Equal(t, 64, fake.Requests.Completed)
	require.NotEqual(t, rep.OutputDigest, fake.OutputDigest, "the fake engine is not the model")
}
