package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/stretchr/testify/require"
)

// These tests run `worker run` in process on the fake engine, so they pass
// with and without the native build tag.

// runCode runs the worker with args and returns its exit code and output.
func runCode(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// writeTrace writes lines as a JSON Lines trace in a temporary directory.
func writeTrace(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return p
}

// traceLine is one Mooncake record; extra is appended verbatim (", ...").
func traceLine(tsMS int64, input, output int, extra string) string {
	blocks := (input + 511) / 512
	ids := make([]string, blocks)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i)
	}
	return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]%s}`,
		tsMS, input, output, strings.Join(ids, ", "), extra)
}

// requestLine is the part of a --requests-out line the tests read.
type requestLine struct {
	Index        int     `json:"index"`
	Rank         int     `json:"rank"`
	PromptTokens int64   `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	TTFTMS       float64 `json:"ttft_ms"`
	TPOTMS       float64 `json:"tpot_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	Error        string  `json:"error"`
}

func readRequests(t *testing.T, path string) []requestLine {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []requestLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r requestLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		out = append(out, r)
	}
	require.NoError(t, sc.Err())
	return out
}

// Issue 9 defect 2: a request whose scaled lengths can never fit is rejected
// with its reason before any of its tokens is synthesised, and the requests
// that fit still run.
func TestRunLengthScaleRejectsWithoutSynthesis(t *testing.T) {
	// At --length-scale 1000: line 1 is a 10 000-token prompt + 1 000 new
	// tokens (fits 65 536 tokens per rank); line 2 is a 300 000 000-token
	// prompt (1.2 GB of token ids if synthesised).
	trace := writeTrace(t,
		traceLine(0, 10, 1, ""),
		traceLine(0, 300000, 1, ""))
	out := filepath.Join(t.TempDir(), "req.jsonl")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	code, stdout, stderr := runCode("run", "--engine", "fake", "--ranks", "2", "--trace", trace, "--length-scale", "1000",
		"--arrival-scale", "0", "--report", "json", "--progress", "off", "--requests-out", out)
	runtime.ReadMemStats(&after)
	require.Equal(t, 0, code, stderr)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<20),
		"the rejected request's 300 000 000 tokens must never be synthesised")
	var rep report.Report
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Equal(t, 2, rep.Requests.Total)
	require.Equal(t, 1, rep.Requests.Completed)
	require.Equal(t, 1, rep.Requests.Rejected)
	require.Len(t, rep.Rejections, 1)
	require.EqualValues(t, 1, rep.Rejections[0].Index)
	require.Contains(t, rep.Rejections[0].Reason, "prompt 300000000")
	require.Contains(t, rep.Rejections[0].Reason, "can never fit the KV pool")
	reqs := readRequests(t, out)
	require.Len(t, reqs, 2)
	require.Empty(t, reqs[0].Error)
	require.EqualValues(t, 10000, reqs[0].PromptTokens)
	require.Equal(t, 1000, reqs[0].OutputTokens)
	require.EqualValues(t, 300000000, reqs[1].PromptTokens)
	require.Contains(t, reqs[1].Error, "can never fit the KV pool")
}

// Issue 9 defect 2: when no request of the trace can ever be served (here
// at --length-scale 1e6 with the default pool of 65 536 tokens per rank),
// the run fails before any work with every line's reason.
func TestRunEveryRequestRejectedFailsUpFront(t *testing.T) {
	trace := writeTrace(t, traceLine(0, 600, 3, ""), traceLine(5, 4000, 1, ""))
	code, _, stderr := runCode("run", "--engine", "fake", "--ranks", "2", "--trace", trace, "--length-scale", "1e6",
		"--arrival-scale", "0", "--progress", "off")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "none of the 2 requests can ever be served")
	require.Contains(t, stderr, "t.jsonl:1: prompt 600000000 + max_new_tokens 3000000")
	require.Contains(t, stderr, "t.jsonl:2: prompt of 4000000000 tokens + max_new_tokens 1000000 exceeds the int32 token range")
}

// Issue 9 defect 3: every scale and every scaled value is checked; bad
// input is an error naming the flag, the config key or the file, line and
// field, before any work starts.
func TestRunRejectsOutOfRangeWorkloadValues(t *testing.T) {
	ok := traceLine(0, 10, 3, "")
	dir := t.TempDir()
	cfg := func(body string) string {
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", len(body)))
		require.NoError(t, os.WriteFile(p, []byte("engine: fake\nworkload:\n"+body), 0o644))
		return p
	}
	lsInf, asNeg, asHuge := cfg("  length_scale: .inf\n"), cfg("  arrival_scale: -2\n"), cfg("  arrival_scale: 1e300\n")
	lsTwo := cfg("  length_scale: 2\n\n")
	arrBad := cfg("  arrivals: \"Poisson\"\n") // 22 bytes: a file name of its own
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"length scale NaN", []string{"--length-scale", "NaN"}, 2, "--length-scale must be a finite number in (0, 2147483647], got NaN"},
		{"length scale Inf", []string{"--length-scale", "Inf"}, 2, "--length-scale must be a finite number in (0, 2147483647], got +Inf"},
		{"length scale 1e300", []string{"--length-scale", "1e300"}, 2, "--length-scale must be a finite number in (0, 2147483647], got 1e+300"},
		{"length scale 1e12", []string{"--length-scale", "1e12"}, 2, "--length-scale must be a finite number in (0, 2147483647]"},
		{"length scale negative", []string{"--length-scale", "-1"}, 2, "--length-scale must be a finite number in (0, 2147483647]"},
		{"arrival scale NaN", []string{"--arrival-scale", "NaN"}, 2, "--arrival-scale must be a finite number ≥ 0, got NaN"},
		{"arrival scale Inf", []string{"--arrival-scale", "Inf"}, 2, "--arrival-scale must be a finite number ≥ 0, got +Inf"},
		{"arrival scale negative", []string{"--arrival-scale", "-0.5"}, 2, "--arrival-scale must be a finite number ≥ 0, got -0.5"},
		{"arrival process unknown", []string{"--arrivals", "gamma"}, 2, `--arrivals must be trace or poisson, got "gamma"`},
		{"config arrival process", []string{"--config", arrBad}, 2, arrBad + `:3 workload.arrivals must be trace or poisson, got "Poisson"`},
		{"arrival scale 1e300", []string{"--arrival-scale", "1e300", "--trace", writeTrace(t, ok, traceLine(7, 10, 3, ""))}, 1,
			`t.jsonl:2: field "timestamp": 7 ms × --arrival-scale 1e+300 is beyond the longest replay of 31536000000 ms (365 days)`},
		{"timestamp 1e13", []string{"--trace", writeTrace(t, ok, traceLine(1e13, 10, 3, ""))}, 1,
			`t.jsonl:2: field "timestamp": 10000000000000 ms × --arrival-scale 1 is beyond the longest replay of 31536000000 ms (365 days)`},
		{"timestamp in exponent form", []string{"--trace", writeTrace(t, `{"timestamp": 1e13, "input_length": 10, "output_length": 3, "hash_ids": [1]}`)}, 1,
			`t.jsonl:1: field "timestamp": 10000000000000 ms × --arrival-scale 1 is beyond the longest replay`},
		{"timestamp beyond int64", []string{"--trace", writeTrace(t, `{"timestamp": 1e19, "input_length": 10, "output_length": 3, "hash_ids": [1]}`)}, 1,
			`t.jsonl:1: field "timestamp" must be a whole number in [0, 9223372036854775807], got 1e19`},
		{"output length beyond int32", []string{"--trace", writeTrace(t, ok, `{"timestamp": 0, "input_length": 10, "output_length": 9223372036854775807, "hash_ids": [1]}`)}, 1,
			`t.jsonl:2: field "output_length" must be a whole number in [1, 2147483647], got 9223372036854775807`},
		{"input length beyond int32", []string{"--trace", writeTrace(t, `{"timestamp": 0, "input_length": 9223372036854775807, "output_length": 3, "hash_ids": [1]}`)}, 1,
			`t.jsonl:1: field "input_length" must be a whole number in [1, 2147483647], got 9223372036854775807`},
		{"fractional output length", []string{"--trace", writeTrace(t, `{"timestamp": 0, "input_length": 10, "output_length": 2.5, "hash_ids": [1]}`)}, 1,
			`t.jsonl:1: field "output_length" must be a whole number in [1, 2147483647], got 2.5`},
		{"config length scale", []string{"--config", lsInf}, 2,
			lsInf + ":3: workload.length_scale: want a finite number, got .inf"},
		{"config arrival scale", []string{"--config", asNeg}, 2,
			asNeg + ":3 workload.arrival_scale must be a finite number ≥ 0, got -2"},
		{"config arrival scale too large for a line", []string{"--config", asHuge, "--trace", writeTrace(t, traceLine(3, 10, 3, ""))}, 1,
			`t.jsonl:1: field "timestamp": 3 ms × ` + asHuge + `:3 workload.arrival_scale 1e+300 is beyond the longest replay`},
		{"flag overrides the config", []string{"--config", lsTwo, "--length-scale", "Inf"}, 2,
			"worker run: --length-scale must be a finite number"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runCode(append([]string{"run", "--engine", "fake", "--progress", "off"}, c.args...)...)
			require.Equal(t, c.code, code, stderr)
			require.Contains(t, stderr, c.want)
		})
	}
}

// Issue 9 defect 3: no latency in any report can be negative, even for an
// arrival stamp far outside the clock's range (the old failure: a scaled
// arrival overflowed time.Duration and TTFT came out near −9.2e12 ms).
func TestLatenciesAreNeverNegative(t *testing.T) {
	cases := []struct{ a, b int64 }{
		{0, 0}, {5, 3}, {math.MinInt64, 0}, {math.MinInt64, math.MaxInt64}, {-7_460_000_000_000_000_000, 1_760_000_000_000_000_000},
		{math.MaxInt64, math.MinInt64}, {1, math.MaxInt64},
	}
	for _, c := range cases {
		v := report.MSBetween(c.a, c.b)
		require.GreaterOrEqual(t, v, 0.0, "report.MSBetween(%d, %d)", c.a, c.b)
		if c.b >= c.a {
			require.InDelta(t, (float64(c.b)-float64(c.a))/1e6, v, 1e-6*math.Abs(v)+1e-9)
		}
	}
	// The tiny arrival scales the checks allow still give sane latencies.
	trace := writeTrace(t, traceLine(0, 40, 3, ""), traceLine(31_536_000_000, 40, 3, ""))
	rep := runJSON(t, "--engine", "fake", "--ranks", "2", "--trace", trace, "--arrival-scale", "1e-300")
	for _, k := range []string{"ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "e2e_ms.p50", "e2e_ms.p99"} {
		require.GreaterOrEqual(t, field(rep, k).(float64), 0.0, k)
	}
	require.EqualValues(t, 2, field(rep, "requests.completed"))
}

// Issue 9 defect 13: sub-agents that share an affinity id go to their
// parent's home rank (where their shared prefix is cached) while each keeps
// its own prompt history for the uncached-prefill estimate.
func TestTraceAffinityKeepsSubAgentsOnTheirHomeRank(t *testing.T) {
	// Block 1 is the parent session's shared prefix. A1 and A2 are two
	// sub-agents of parent P; B and C are unrelated conversations that move
	// the round-robin cursor so that a new key after them lands elsewhere.
	lines := func(affinity bool) []string {
		p := ""
		if affinity {
			p = `, "affinity_id": "P"`
		}
		return []string{
			`{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 11], "conversation_id": "A1"` + p + `}`,
			`{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [2], "conversation_id": "B"}`,
			`{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [3], "conversation_id": "C"}`,
			`{"timestamp": 300, "input_length": 300, "output_length": 4, "hash_ids": [1], "conversation_id": "A2"` + p + `}`,
			`{"timestamp": 600, "input_length": 1200, "output_length": 4, "hash_ids": [1, 11, 12], "conversation_id": "A1"` + p + `}`,
			`{"timestamp": 900, "input_length": 700, "output_length": 4, "hash_ids": [1, 21], "conversation_id": "A2"` + p + `}`,
		}
	}
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	type outcome struct {
		ranks   []int
		reused  float64
		demoted int
	}
	serveTrace := func(t *testing.T, affinity bool, uncached string) outcome {
		t.Setenv("TLLM_V2_CTX_DEMOTE_UNCACHED_TOKENS", uncached)
		dir := t.TempDir()
		trace := writeTrace(t, lines(affinity)...)
		rep := runJSON(t, "--engine", "fake", "--ranks", "4", "--router", "conversation", "--trace", trace,
			"--arrival-scale", "1", "--requests-out", filepath.Join(dir, "req.jsonl"),
			"--iter-log", filepath.Join(dir, "iter-{rank}.jsonl"))
		require.EqualValues(t, 6, field(rep, "requests.completed"))
		var o outcome
		for _, r := range readRequests(t, filepath.Join(dir, "req.jsonl")) {
			o.ranks = append(o.ranks, r.Rank)
		}
		o.reused = field(rep, "prefix.reused_tokens").(float64)
		for rank := 0; rank < 4; rank++ {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("iter-%d.jsonl", rank)))
			require.NoError(t, err)
			for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
				var rec struct {
					NumDemoted int `json:"num_demoted"`
				}
				require.NoError(t, json.Unmarshal(l, &rec))
				o.demoted += rec.NumDemoted
			}
		}
		return o
	}

	with := serveTrace(t, true, "700")
	home := with.ranks[0]
	for _, i := range []int{3, 4, 5} {
		require.Equal(t, home, with.ranks[i], "line %d shares affinity P and must run on P's home rank %d", i+1, home)
	}
	require.NotEqual(t, home, with.ranks[1])
	require.NotEqual(t, home, with.ranks[2])
	// Each sub-agent keeps its own history: A1's second turn grows by 600
	// over A1's first turn (not by 900 over A2's first turn, the latest
	// prompt of affinity P), so with U = 700 nothing is demoted.
	require.Zero(t, with.demoted, "an estimate keyed by the affinity id instead of the conversation would demote A1's second turn")
	// The observation can fail: with U = 500 the 600-token growth is long.
	require.Positive(t, serveTrace(t, true, "500").demoted)

	// Without affinity ids the two sub-agents are separate keys: A2 starts
	// on another rank and loses the parent's cached prefix.
	without := serveTrace(t, false, "700")
	require.NotEqual(t, without.ranks[0], without.ranks[3], "A2 without an affinity id is a new key")
	require.Equal(t, without.ranks[0], without.ranks[4], "A1's second turn follows its conversation")
	require.Greater(t, with.reused, without.reused, "sharing the home rank must reuse the parent's prefix")
}

// Issue 9 defect 13: attention_dp_rank pins a request to a rank; strict
// requests (attention_dp_relax false) wait for their rank, relaxed ones go
// elsewhere when it is full and to their rank when it has room.
func TestTraceAttentionDPRankPinning(t *testing.T) {
	trace := writeTrace(t,
		traceLine(0, 40, 8, `, "attention_dp_rank": 1, "attention_dp_relax": false`),
		traceLine(0, 40, 8, `, "attention_dp_rank": 1, "attention_dp_relax": false`),
		traceLine(0, 40, 8, `, "attention_dp_rank": 1, "attention_dp_relax": true`),
		traceLine(0, 40, 8, `, "attention_dp_rank": 1`))
	ranksOf := func(t *testing.T, args ...string) []int {
		out := filepath.Join(t.TempDir(), "req.jsonl")
		rep := runJSON(t, append([]string{"--engine", "fake", "--ranks", "2", "--trace", trace, "--requests-out", out}, args...)...)
		require.EqualValues(t, 4, field(rep, "requests.completed"))
		var ranks []int
		for _, r := range readRequests(t, out) {
			ranks = append(ranks, r.Rank)
		}
		return ranks
	}
	// Room for everyone: every target is honoured, strict or relaxed.
	require.Equal(t, []int{1, 1, 1, 1}, ranksOf(t))
	// One request per rank: the second strict request waits for rank 1; the
	// relaxed one is balanced onto rank 0 while rank 1 is full.
	tight := ranksOf(t, "--max-active-per-rank", "1")
	require.Equal(t, 1, tight[0])
	require.Equal(t, 1, tight[1], "a strict request waits for its rank")
	require.Equal(t, 0, tight[2], "a relaxed request goes elsewhere while its rank is full")

	// A target outside the run's ranks is an error naming the line and field.
	bad := writeTrace(t, traceLine(0, 40, 8, ""), traceLine(0, 40, 8, `, "attention_dp_rank": 2`))
	code, _, stderr := runCode("run", "--engine", "fake", "--ranks", "2", "--trace", bad, "--progress", "off")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, `t.jsonl:2: field "attention_dp_rank": rank 2 is out of range: the run has 2 attention-DP ranks (allowed: 0 to 1)`)
}

// The up-front check and the ranks apply the same rule (scheduler.Admission)
// to the same configuration: at the boundary a request that fits runs, and
// one token more is refused before any rank starts.
func TestUpFrontCheckMatchesTheRanks(t *testing.T) {
	cases := []struct {
		name          string
		args          []string
		input, output int
		want          string // "" = served
	}{
		{"pool exactly", nil, 60, 4, ""},
		{"pool + 1", nil, 61, 4, "prompt 61 + max_new_tokens 4 = 65 tokens can never fit the KV pool of 64 tokens (4 pages × 16)"},
		{"max_seq_len", []string{"--max-seq-len", "40"}, 40, 1, "prompt of 40 tokens + 1 exceeds max_seq_len 40"},
		{"max_seq_len exactly", []string{"--max-seq-len", "40"}, 39, 1, ""},
		{"guaranteed no evict", []string{"--policy", "guaranteed_no_evict", "--tokens-per-page", "10", "--pages", "6"}, 55, 6,
			"needs 7 pages to completion, the pool has 6"},
		{"chunking off", []string{"--chunked-prefill=false", "--max-num-tokens", "32"}, 33, 1,
			"prompt of 33 tokens exceeds max_num_tokens 32 and chunked prefill is off"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			trace := writeTrace(t, traceLine(0, c.input, c.output, ""))
			args := append([]string{"run", "--engine", "fake", "--ranks", "2", "--pages", "4", "--tokens-per-page", "16",
				"--trace", trace, "--arrival-scale", "0", "--report", "json", "--progress", "off"}, c.args...)
			code, stdout, stderr := runCode(args...)
			if c.want == "" {
				require.Equal(t, 0, code, stderr)
				require.Contains(t, stdout, `"completed": 1`)
				return
			}
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, "none of the 1 requests can ever be served")
			require.Contains(t, stderr, "t.jsonl:1: "+c.want)
			// Beside a request that fits, the ranks reject it with the same reason.
			args[10] = writeTrace(t, traceLine(0, 8, 1, ""), traceLine(0, c.input, c.output, "")) // after --trace
			code, stdout, stderr = runCode(args...)
			require.Equal(t, 0, code, stderr)
			var rep report.Report
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
			require.Equal(t, 1, rep.Requests.Completed)
			require.Len(t, rep.Rejections, 1)
			require.Equal(t, c.want, rep.Rejections[0].Reason)
		})
	}
}

// TestRunPoissonArrivals: --arrivals poisson replays the same requests (the
// same outputs) at the trace's mean rate without its bursts, so the
// latencies change and the span stays about the same; the same seed gives
// the same run.
func TestRunPoissonArrivals(t *testing.T) {
	trace := filepath.Join("..", "..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	runTwin := func(arrivals string) report.Report {
		code, stdout, stderr := runCode("run", "--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--ranks", "2",
			"--pages", "0", "--trace", trace, "--limit", "200", "--arrival-scale", "0.05", "--arrivals", arrivals,
			"--report", "json", "--progress", "off")
		require.Equal(t, 0, code, stderr)
		var rep report.Report
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
		require.Equal(t, 200, rep.Requests.Completed)
		return rep
	}
	tr, po, again := runTwin("trace"), runTwin("poisson"), runTwin("poisson")
	require.Equal(t, tr.OutputDigest, po.OutputDigest, "the same requests, the same outputs")
	require.NotEqual(t, tr.TTFTMS, po.TTFTMS, "other arrival times, other latencies")
	require.Equal(t, po.TTFTMS, again.TTFTMS, "the same seed, the same run")
	require.InEpsilon(t, tr.DurationS, po.DurationS, 0.5, "about the same span")
}
