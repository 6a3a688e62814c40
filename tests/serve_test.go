//go:build native

package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	promodel "github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model/modeltest"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startServe starts `worker serve` (through launcher when given, e.g.
// mpirun) and waits until /health is ready.
func startServe(t *testing.T, launcher []string, bin string, args ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	addr := freeAddr(t)
	full := append(append(launcher, bin, "serve", "--http", addr, "--log-level", "warn"), args...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill() }) //nolint:errcheck
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, "http://" + addr, &errb
			}
		}
		require.True(t, time.Now().Before(deadline), "the server never became ready: %s", errb.String())
		time.Sleep(200 * time.Millisecond)
	}
}

// stopServe sends SIGTERM (to rank 0's process when pid > 0: mpirun
// itself tears a job down on SIGTERM) and requires a clean exit.
func stopServe(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer, pid ...int) {
	t.Helper()
	if len(pid) > 0 {
		require.NoError(t, syscall.Kill(pid[0], syscall.SIGTERM))
	} else {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "worker serve must drain and exit 0 on SIGTERM: %s", out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("worker serve did not exit after SIGTERM: %s", out.String())
	}
}

func complete(t *testing.T, base, body string) map[string]any {
	t.Helper()
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode, string(b))
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func completionText(m map[string]any) string {
	return m["choices"].([]any)[0].(map[string]any)["text"].(string)
}

// TestOpenAIClientAgainstServe: the official openai Python client
// (scripts/ensure-pyclient.sh) against `worker serve` on SmolLM2 with 2
// ranks: completions and chat, streaming and not, token-id prompts, stop
// strings, routing fields (prompt_cache_key as the client sends it, the
// others through extra_body), and the error statuses; then SIGTERM drains
// and exits 0.
func TestOpenAIClientAgainstServe(t *testing.T) {
	m := modeltest.SmolLM2(t)
	py, err := exec.Command("../scripts/ensure-pyclient.sh").Output()
	require.NoError(t, err, "installing the openai client")
	bin := worker(t)
	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2", "--api-key", "sekrit")
	runClientCheck(t, py, out, "openai_client_check.py", base, "sekrit", modeltest.SmolLM2Base)
	stopServe(t, cmd, out)
}

// runClientCheck runs a Python client check with the interpreter (and
// PYTHONPATH, when pip --target was used) that ensure-pyclient.sh printed;
// it must exit 0 and print OK.
func runClientCheck(t *testing.T, py []byte, server fmt.Stringer, script string, args ...string) {
	t.Helper()
	lines := strings.Fields(string(py))
	check := exec.Command(lines[0], append([]string{script}, args...)...)
	if len(lines) > 1 {
		check.Env = append(os.Environ(), "PYTHONPATH="+lines[1])
	}
	res, err := check.CombinedOutput()
	require.NoError(t, err, "%s\nserver:\n%s", res, server.String())
	require.Contains(t, string(res), "OK")
}

// TestOpenAIClientToolCalls: the official openai client calls a tool
// through `worker serve` with SmolLM2, a chat template of ours that
// renders tools (--chat-template) and --enable-auto-tool-choice
// --tool-call-parser hermes: whole and streamed, the model's call comes
// back as tool_calls (tests/openai_tools_check.py); structured outputs,
// the Responses API and prompt scoring (echo with logprobs,
// prompt_logprobs) on the same server.
func TestOpenAIClientToolCalls(t *testing.T) {
	m := modeltest.SmolLM2(t)
	py, err := exec.Command("../scripts/ensure-pyclient.sh").Output()
	require.NoError(t, err, "installing the openai client")
	bin := worker(t)
	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2", "--chat-template", "testdata/hermes-tools.jinja",
		"--enable-auto-tool-choice", "--tool-call-parser", "hermes")
	runClientCheck(t, py, out, "openai_tools_check.py", base, modeltest.SmolLM2Base)
	runClientCheck(t, py, out, "openai_structured_check.py", base, modeltest.SmolLM2Base)
	runClientCheck(t, py, out, "openai_responses_check.py", base, modeltest.SmolLM2Base)
	runClientCheck(t, py, out, "openai_scoring_check.py", base, modeltest.SmolLM2Base)
	stopServe(t, cmd, out)
}

// TestGuidedSameOnEveryLayout: a sampled request under a JSON schema
// (structured outputs) gives the same valid JSON on one rank, two
// attention-DP ranks and two Helix CP ranks: every rank masks its picks
// from the same guide and the same tokens. A scored prompt (echo with
// logprobs, prompt_logprobs) gives the same entries on all three.
func TestGuidedSameOnEveryLayout(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	body := `{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.9, "seed": 3, "n": 2,` +
		` "guided_json": {"type": "object", "properties": {"hero": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, "required": ["hero", "age"]}}`
	// A scored prompt (echo with logprobs, prompt_logprobs) long enough to
	// span every Helix member's pages: the same entries, bit for bit.
	scored := `{"prompt": "` + strings.Repeat("Once upon a time, in a small village by the sea, there lived an old fisherman. ", 4) +
		`", "max_tokens": 3, "logprobs": 2, "echo": true, "prompt_logprobs": 3}`
	var want, wantScored []any
	for _, layout := range [][]string{{"--ranks", "1"}, {"--ranks", "2"}, {"--cp", "2"}} {
		cmd, base, out := startServe(t, nil, bin, append([]string{"--model", m}, layout...)...)
		got := complete(t, base, body)["choices"].([]any)
		gotScored := complete(t, base, scored)["choices"].([]any)
		stopServe(t, cmd, out)
		if wantScored == nil {
			wantScored = gotScored
			pl := gotScored[0].(map[string]any)["prompt_logprobs"].([]any)
			require.Greater(t, len(pl), 64, "the scored prompt's tokens")
		} else {
			require.Equal(t, wantScored, gotScored, "%v: the scored prompt", layout)
		}
		for _, c := range got {
			ch := c.(map[string]any)
			var v struct {
				Hero *string `json:"hero"`
				Age  *int64  `json:"age"`
			}
			require.NoError(t, json.Unmarshal([]byte(ch["text"].(string)), &v), "%v: %q", layout, ch["text"])
			require.True(t, v.Hero != nil && v.Age != nil && len(*v.Hero) <= 20, "%v: %q", layout, ch["text"])
			require.Equal(t, "stop", ch["finish_reason"])
		}
		if want == nil {
			want = got
			require.NotEqual(t, got[0].(map[string]any)["text"], got[1].(map[string]any)["text"], "the two choices sample alike")
			continue
		}
		require.Equal(t, want, got, "%v", layout)
	}
}

// TestServeUnderMPIRun: `mpirun -np 2 bin/worker serve` answers over HTTP
// from rank 0 with the same greedy text as in-process ranks (a guided
// request's too), an idle rank
// other than rank 0 stays off the CPU (the idle doorbell; spinning in MPI's
// collective it would use a whole core), and the whole job exits 0 on
// SIGTERM.
func TestServeUnderMPIRun(t *testing.T) {
	m := modeltest.SmolLM2(t)
	needMPIRun(t)
	bin := worker(t)
	body := `{"prompt": "Once upon a time", "max_tokens": 12}`
	// A guided request: its guide crosses the MPI broadcast and every
	// rank compiles it for its own vocabulary.
	guided := `{"prompt": "Once upon a time", "max_tokens": 30, "guided_json": {"type": "object", "properties": {"hero": {"type": "string", "maxLength": 12}}, "required": ["hero"]}}`
	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2")
	want := completionText(complete(t, base, body))
	wantGuided := completionText(complete(t, base, guided))
	require.Regexp(t, `^\{"hero": ?"[^"]{0,12}"\}$`, wantGuided)
	stopServe(t, cmd, out)

	cmd, base, out = startServe(t, []string{"mpirun", "--oversubscribe", "-np", "2"}, bin, "--model", m)
	var got []string
	for i := 0; i < 4; i++ { // several, so both ranks serve some
		got = append(got, completionText(complete(t, base, body)))
	}
	for i, g := range got {
		require.Equal(t, want, g, "request %d", i)
	}
	for i := 0; i < 2; i++ {
		require.Equal(t, wantGuided, completionText(complete(t, base, guided)), "guided request %d", i)
	}
	rank1 := rankPID(t, bin, 1)
	time.Sleep(300 * time.Millisecond) // past the first idle iterations, which spin
	before, t0 := cpuTicks(t, rank1), time.Now()
	time.Sleep(2 * time.Second)
	used := float64(cpuTicks(t, rank1)-before) / 100 // USER_HZ
	require.Less(t, used, time.Since(t0).Seconds()/2, "rank 1 of an idle server used %.2fs of CPU in %v", used, time.Since(t0))
	stopServe(t, cmd, out, rankZeroPID(t, bin))
}

// cpuTicks is the CPU time process pid has used (user and system, in
// clock ticks of 1/100 s: /proc/PID/stat fields 14 and 15).
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// The command name (field 2) may hold spaces: count from its ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	require.Greater(t, len(f), 13, "/proc/%d/stat: %s", pid, b)
	var utime, stime int64
	_, err = fmt.Sscan(f[11], &utime)
	require.NoError(t, err)
	_, err = fmt.Sscan(f[12], &stime)
	require.NoError(t, err)
	return utime + stime
}

// rankZeroPID finds the process of bin that Open MPI started as rank 0.
func rankZeroPID(t *testing.T, bin string) int {
	t.Helper()
	return rankPID(t, bin, 0)
}

// rankPID finds the process of bin that Open MPI started as rank.
func rankPID(t *testing.T, bin string, rank int) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, d := range dirs {
		var pid int
		if _, err := fmt.Sscan(d.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.HasPrefix(cmdline, []byte(bin+"\x00serve")) {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, []byte(fmt.Sprintf("\x00OMPI_COMM_WORLD_RANK=%d\x00", rank))) {
			return pid
		}
	}
	t.Fatalf("rank %d's process not found", rank)
	return 0
}

// scrape reads /metrics and returns every sample as "name{labels}" → value.
func scrape(t *testing.T, base, key string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	parser := expfmt.NewTextParser(promodel.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err, "the Prometheus text format parses")
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetName() != "model" {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestServeCancelOnDisconnectAndQueueBound: clients that go away mid-stream
// have their requests withdrawn on every rank (no page left in use, seen
// through /metrics), a full queue answers 429, and /metrics parses.
func TestServeCancelOnDisconnectAndQueueBound(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2", "--no-prefix-reuse", "--max-queue", "4",
		"--metrics-compat", "vllm")
	body := `{"prompt": "Write a long story about the sea.", "max_tokens": 400, "stream": true, "ignore_eos": true}`
	var streams []*http.Response
	for i := 0; i < 4; i++ {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		buf := make([]byte, 64)
		_, err = resp.Body.Read(buf) // the first event: the request is running
		require.NoError(t, err)
		streams = append(streams, resp)
	}
	// Four in flight: the fifth is over --max-queue.
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"error"`)
	for _, s := range streams {
		s.Body.Close() // the client goes away
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mt := scrape(t, base, "")
		idle := mt["lockstep_requests_running{}"] == 0 && mt["lockstep_requests_waiting{}"] == 0 &&
			mt["lockstep_rank_kv_cache_used_pages{rank=0}"] == 0 && mt["lockstep_rank_kv_cache_used_pages{rank=1}"] == 0
		if idle && mt["lockstep_requests_finished_total{finish_reason=cancelled}"] >= 4 {
			require.Equal(t, 1.0, mt["lockstep_ready{}"])
			require.Positive(t, mt["lockstep_time_to_first_token_seconds{}_count"])
			// --metrics-compat vllm: vLLM's names beside ours, per engine (rank).
			for _, e := range []string{"0", "1"} {
				require.Contains(t, mt, "vllm:num_requests_running{engine="+e+",model_name="+modeltest.SmolLM2Base+"}")
				require.Contains(t, mt, "vllm:kv_cache_usage_perc{engine="+e+",model_name="+modeltest.SmolLM2Base+"}")
			}
			var aborted float64
			for k, v := range mt {
				if strings.HasPrefix(k, "vllm:request_success_total{") && strings.Contains(k, "finished_reason=abort") {
					aborted += v
				}
			}
			require.Equal(t, 4.0, aborted, "the cancelled requests are vLLM's aborts")
			break
		}
		require.True(t, time.Now().Before(deadline), "cancelled requests still hold the fleet: %v", mt)
		time.Sleep(200 * time.Millisecond)
	}
	stopServe(t, cmd, out)
}

// TestLoadgenOverHTTPMatchesRun: `worker loadgen` replaying the
// conversation trace against `worker serve` (2 ranks) gets back, through
// the token ids of the API, the same outputs as `worker run` on that trace
// (1 rank): the digest rule holds over HTTP.
func TestLoadgenOverHTTPMatchesRun(t *testing.T) {
	m := modeltest.SmolLM2(t)
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	args := []string{"--trace", trace, "--limit", "16", "--length-scale", "0.01"}
	want := serve(t, bin, append(args, "--model", m, "--ranks", "1")...)
	require.Equal(t, 16, want.Requests.Completed)

	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2")
	lg := exec.Command(bin, append([]string{"loadgen", "--url", base, "--arrival-scale", "0", "--vocab-size", "49152",
		"--seed", "1", "--return-token-ids", "--report", "json"}, args...)...)
	res, err := lg.Output()
	require.NoError(t, err, string(res))
	var got report
	require.NoError(t, json.Unmarshal(res, &got), string(res))
	require.Equal(t, 16, got.Requests.Completed)
	require.Equal(t, want.OutputDigest, got.OutputDigest, "loadgen over HTTP and worker run")
	stopServe(t, cmd, out)
}

// TestServeRankKilledUnderMPIRun (issue 23, defect 13): `kill -9` of rank
// 1 under mpirun gives the clients of rank 0 an HTTP answer before the
// launcher tears the job down: the stream in flight an error event naming
// the rank, a waiting request a 500 naming it.
func TestServeRankKilledUnderMPIRun(t *testing.T) {
	m := modeltest.SmolLM2(t)
	needMPIRun(t)
	bin := worker(t)
	cmd, base, out := startServe(t, []string{"mpirun", "--oversubscribe", "-np", "2"}, bin, "--model", m)
	stream, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "Write a long story.", "max_tokens": 2000, "stream": true, "ignore_eos": true}`))
	require.NoError(t, err)
	defer stream.Body.Close()
	first := make([]byte, 64)
	_, err = stream.Body.Read(first) // the first event: the request is running
	require.NoError(t, err)
	plain := make(chan string, 1)
	go func() {
		resp, err := http.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt": "Another story.", "max_tokens": 2000, "ignore_eos": true}`))
		if err != nil {
			plain <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		plain <- fmt.Sprintf("HTTP %d %s", resp.StatusCode, b)
	}()
	time.Sleep(500 * time.Millisecond) // the second request is queued or running
	pid := rankPID(t, bin, 1)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	rest, _ := io.ReadAll(stream.Body)
	require.Contains(t, string(rest), `"error"`, "the stream ends with an error event: %s\n%s", rest, out.String())
	require.Contains(t, string(rest), "rank 1")
	got := <-plain
	require.Contains(t, got, "HTTP 500", out.String())
	require.Contains(t, got, "rank 1")
	cmd.Wait() //nolint:errcheck // mpirun reports the killed rank
}
