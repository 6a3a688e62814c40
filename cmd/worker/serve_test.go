package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/nccl"
)

// runJSON runs `worker run --report json` with args and decodes the report.
func runJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out, errb bytes.Buffer
	full := append([]string{"run", "--report", "json", "--progress", "off", "--arrival-scale", "0"}, args...)
	code := run(full, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s", errb.String())
	var rep map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	return rep
}

func field(rep map[string]any, path string) any {
	var v any = rep
	for _, k := range strings.Split(path, ".") {
		v = v.(map[string]any)[k]
	}
	return v
}

func TestRunFakeEngineReportFields(t *testing.T) {
	rep := runJSON(t, "--engine", "fake", "--ranks", "2", "--length-scale", "0.05")
	for _, k := range []string{"requests.total", "requests.completed", "requests.rejected", "tokens.prompt",
		"tokens.generated", "iterations", "ranks", "ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99", "tpot_ms.p50",
		"e2e_ms.p99", "lockstep_waste", "preemptions.suspended", "preemptions.recompute", "output_digest"} {
		require.NotNil(t, field(rep, k), k)
	}
	require.EqualValues(t, 64, field(rep, "requests.total"))
	require.EqualValues(t, 64, field(rep, "requests.completed"))
	require.Len(t, field(rep, "output_digest"), 64)
}

func TestRunDigestIndependentOfRanksFake(t *testing.T) {
	a := runJSON(t, "--engine", "fake", "--ranks", "1", "--length-scale", "0.05")
	b := runJSON(t, "--engine", "fake", "--ranks", "4", "--length-scale", "0.05")
	require.Equal(t, a["output_digest"], b["output_digest"])
}

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 0}\n"), 0o644))
	cases := []struct {
		args []string
		want string
		code int
	}{
		{[]string{"--engine", "gpu"}, `--engine "gpu" is not allowed (allowed: cpu, cuda, twin, fake)`, 2},
		{[]string{"--report", "xml"}, `(allowed: text, json)`, 2},
		{[]string{"--pages", "0"}, `--pages must be at least 1`, 2},
		{[]string{"--model", "gpt"}, `unknown model preset "gpt"`, 2},
		{[]string{"--policy", "fifo"}, `allowed: max_utilization, guaranteed_no_evict`, 2},
		{[]string{"--engine", "fake", "--trace", bad}, `bad.jsonl:2: field "input_length" is missing`, 1},
		{[]string{"--engine", "fake", "--trace", filepath.Join(dir, "missing.jsonl")}, `no such file`, 1},
		{[]string{"--bogus"}, `flag provided but not defined: -bogus`, 2},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := run(append([]string{"run", "--progress", "off"}, c.args...), &out, &errb)
		require.Equal(t, c.code, code, "%v: %s", c.args, errb.String())
		require.Contains(t, errb.String(), c.want, "%v", c.args)
	}
}

func TestConfigFileAndFlagsOverride(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("engine: fake\nranks: 3\nkv:\n  pages: 0\nworkload:\n  limit: 5\n  length_scale: 0.05\n"), 0o644))
	var out, errb bytes.Buffer
	code := run([]string{"run", "--config", cfg, "--progress", "off"}, &out, &errb)
	require.Equal(t, 2, code)
	require.Contains(t, errb.String(), cfg+":4 kv.pages must be at least 1", "the file's value is named as the file's key")
	rep := runJSON(t, "--config", cfg, "--pages", "512")
	require.EqualValues(t, 3, rep["ranks"])
	require.EqualValues(t, 5, field(rep, "requests.total"))

	require.NoError(t, os.WriteFile(cfg, []byte("engine: fake\nrankz: 3\n"), 0o644))
	code = run([]string{"run", "--config", cfg, "--progress", "off"}, &out, &errb)
	require.Equal(t, 2, code)
	require.Contains(t, errb.String(), "rankz")
}

func TestServeRefusesWhatItCannotServe(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "twin"}, "serve needs a real engine"},
		{[]string{"--trace", "x.jsonl"}, "serve takes its requests over HTTP"},
		{[]string{"--max-queue", "0"}, "--max-queue must be at least 1"},
		{[]string{"--drain-timeout", "-1s"}, "--drain-timeout must not be negative"},
		{[]string{"--request-timeout", "-1s"}, "--request-timeout must not be negative"},
		{[]string{"--max-connections", "-1"}, "--max-connections must not be negative"},
		{[]string{"--idle-timeout", "0s"}, "--idle-timeout must be positive"},
		{[]string{"--max-body-bytes", "0"}, "--max-body-bytes must be at least 1"},
		{[]string{"--metrics-compat", "sglang"}, "--metrics-compat must be vllm"},
		{[]string{"--http", "256.0.0.1:1", "--engine", "fake"}, "--http 256.0.0.1:1"},
	} {
		err := runAPIServe(c.args, io.Discard, io.Discard)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}

// The first signal drains; a second one during the drain exits at once
// (issue 23, defect 15).
func TestSecondSignalExitsAtOnce(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	drained := make(chan struct{})
	exited := make(chan int, 1)
	var errb bytes.Buffer
	done := make(chan struct{})
	go func() {
		onSignals(sigs, &errb, time.Hour, func(ctx context.Context) {
			close(drained)
			<-ctx.Done() // a drain that would wait for its whole timeout
		}, func(code int) { exited <- code })
		close(done)
	}()
	sigs <- syscall.SIGTERM
	<-drained
	select {
	case <-exited:
		t.Fatal("the first signal must drain, not exit")
	case <-time.After(50 * time.Millisecond):
	}
	sigs <- syscall.SIGINT
	select {
	case code := <-exited:
		require.Equal(t, 1, code)
	case <-time.After(5 * time.Second):
		t.Fatal("a second signal during the drain must exit at once")
	}
	<-done
	require.Contains(t, errb.String(), "second signal")
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// `worker serve` loads no workload: its startup line says the requests
// come over HTTP, not the built-in sample's count (issue 23); SIGTERM
// drains and returns.
func TestServeStartsWithoutAWorkload(t *testing.T) {
	errb, stop := serveInProcess(t, "--engine", "fake", "--ranks", "2", "--http", "127.0.0.1:0")
	require.Contains(t, errb.String(), `"requests": "over HTTP"`)
	require.NotContains(t, errb.String(), `"requests": 64`)
	stop()
}

// serveInProcess runs `worker serve args` in this process until its
// startup line; stop sends SIGTERM and waits for the drain.
func serveInProcess(t *testing.T, args ...string) (errb *syncBuffer, stop func()) {
	errb = &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- runAPIServe(args, io.Discard, errb) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(errb.String(), "\tserving\t") {
		require.True(t, time.Now().Before(deadline), "no startup line: %s", errb.String())
		time.Sleep(10 * time.Millisecond)
	}
	return errb, func() {
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
		select {
		case err := <-done:
			require.NoError(t, err, errb.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("serve did not drain: %s", errb.String())
		}
	}
}

// `worker serve --cpuprofile --memprofile` writes both profiles when it
// exits (it took the flags and wrote nothing before).
func TestServeWritesProfiles(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	_, stop := serveInProcess(t, "--engine", "fake", "--ranks", "2", "--http", "127.0.0.1:0",
		"--cpuprofile", cpu, "--memprofile", mem)
	stop()
	for _, p := range []string{cpu, mem} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Greater(t, len(b), 2, p)
		require.Equal(t, []byte{0x1f, 0x8b}, b[:2], "%s is not a gzip-compressed profile", p)
	}
}

// Under a launch of several processes a profile's path names each rank's
// file with {rank}; without it rank 0 alone writes.
func TestProfilePathPerRank(t *testing.T) {
	one := nccl.Launch{WorldSize: 1}
	r0, r3 := nccl.Launch{WorldSize: 4, Rank: 0}, nccl.Launch{WorldSize: 4, Rank: 3}
	require.Equal(t, "cpu.pprof", profilePath("cpu.pprof", one))
	require.Equal(t, "cpu.pprof", profilePath("cpu.pprof", r0))
	require.Equal(t, "", profilePath("cpu.pprof", r3))
	require.Equal(t, "cpu_3.pprof", profilePath("cpu_{rank}.pprof", r3))
	require.Equal(t, "cpu_0.pprof", profilePath("cpu_{rank}.pprof", one))
	require.Equal(t, "", profilePath("", r0))
}
