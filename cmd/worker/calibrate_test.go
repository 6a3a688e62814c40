package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/executor"
)

// calM is the token budget of the logged runs in these tests.
const calM = 8192

// logChunk is one iteration-log record with a single full chunk, written
// with the executor's own record type so that the field names are the real
// writer's; deviceMS is the iteration's time on the rank and the fleet's.
func logChunk(rank int, it int64, deviceMS float64, id uint64, kv int) executor.IterRecord {
	m := calM
	return executor.IterRecord{V: 1, Rank: rank, Iter: it, DeviceMS: &deviceMS, FleetDeviceMS: &deviceMS, CanQueue: true,
		NumCtxRequests: 1, CtxTokens: calM, CtxRequestIDs: []uint64{id}, CtxKVStart: []int{kv},
		CtxChunkTokens: []int{calM}, CtxCachedKVTokens: kv,
		CostS: float64(calM) * (float64(kv) + calM/2), MaxNumTokens: &m}
}

// writeLogs writes one JSON Lines file per rank, dir/iter.<rank>.jsonl.
func writeLogs(t *testing.T, dir string, byRank [][]executor.IterRecord) {
	t.Helper()
	for r, recs := range byRank {
		var b bytes.Buffer
		for _, rec := range recs {
			line, err := json.Marshal(rec)
			require.NoError(t, err)
			b.Write(append(line, '\n'))
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("iter.%d.jsonl", r)), b.Bytes(), 0o644))
	}
}

// workedExampleLogs writes the §8.4 input (iterations 0..iters-1) as two
// rank files and returns the directory.
func workedExampleLogs(t *testing.T, iters int64) string {
	t.Helper()
	dir := t.TempDir()
	byRank := make([][]executor.IterRecord, 2)
	for it := range iters {
		kv := 400_000 + calM*int(it)
		dev := 1465 + 0.00862*float64(kv)
		byRank[0] = append(byRank[0], logChunk(0, it, dev, 1, kv))
		byRank[1] = append(byRank[1], logChunk(1, it, dev, uint64(100+it), 0))
	}
	writeLogs(t, dir, byRank)
	return dir
}

// calibrate runs `worker calibrate args...` through the dispatcher.
func calibrate(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(append([]string{"calibrate"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCalibrateWorkedExample(t *testing.T) {
	want, err := os.ReadFile("testdata/calibrate-worked-example.golden")
	require.NoError(t, err)
	dir := workedExampleLogs(t, 20)

	code, out, errOut := calibrate(filepath.Join(dir, "iter.{rank}.jsonl"))
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, string(want), out)
	assert.Empty(t, errOut)

	// Explicit files give the same report, whatever their order.
	code, out2, _ := calibrate(filepath.Join(dir, "iter.1.jsonl"), filepath.Join(dir, "iter.0.jsonl"))
	require.Equal(t, 0, code)
	assert.Equal(t, out, out2)
}

func TestCalibrateNoSpanExit2(t *testing.T) {
	dir := workedExampleLogs(t, 6) // rank 0 qualifies for 5 iterations only
	code, out, errOut := calibrate(filepath.Join(dir, "iter.{rank}.jsonl"))
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "no monopoly span found (need at least one span of 6 iterations)")

	code, _, errOut = calibrate("--min-span", "5", filepath.Join(dir, "iter.{rank}.jsonl"))
	assert.Equal(t, 0, code, errOut)

	// A plot over one of the logs read is refused before anything is written.
	log0 := filepath.Join(dir, "iter.0.jsonl")
	before, err := os.ReadFile(log0)
	require.NoError(t, err)
	code, _, errOut = calibrate("--min-span", "5", "--plot", log0, filepath.Join(dir, "iter.{rank}.jsonl"))
	assert.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, `--plot "`+log0+`" is one of the iteration logs read`)
	after, err := os.ReadFile(log0)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

func TestCalibrateUnreadableExit1(t *testing.T) {
	dir := workedExampleLogs(t, 20)
	path := filepath.Join(dir, "iter.1.jsonl")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(raw), "\n")
	lines[2] = `{"v":1,"rank":1,"iter":2,"device_ms":` + "\n" // truncated record on line 3
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644))

	code, out, errOut := calibrate(filepath.Join(dir, "iter.{rank}.jsonl"))
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, path+":3: ")

	// A record of another kind of log names what is missing.
	require.NoError(t, os.WriteFile(path, []byte("\n{\"ts\": 1}\n"), 0o644))
	code, _, errOut = calibrate(path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, path+`:2: a record needs "rank" and "iter"`)

	empty := filepath.Join(dir, "empty.jsonl")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o644))
	code, _, errOut = calibrate(empty)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no iteration-log records in "+empty)

	code, _, errOut = calibrate(filepath.Join(dir, "missing.jsonl"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "missing.jsonl")
}

func TestCalibrateRankExpansion(t *testing.T) {
	dir := workedExampleLogs(t, 20)
	// Not a rank: ignored by the pattern.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "iter.old.jsonl"), []byte("garbage\n"), 0o644))
	files, err := report.ExpandLogPaths([]string{filepath.Join(dir, "iter.{rank}.jsonl"), "extra.jsonl"})
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "iter.0.jsonl"), filepath.Join(dir, "iter.1.jsonl"), "extra.jsonl"}, files)

	// Ranks sort numerically, not as text.
	for _, r := range []int{2, 10} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("iter.%d.jsonl", r)), nil, 0o644))
	}
	files, err = report.ExpandLogPaths([]string{filepath.Join(dir, "iter.{rank}.jsonl")})
	require.NoError(t, err)
	require.Len(t, files, 4)
	assert.Equal(t, filepath.Join(dir, "iter.10.jsonl"), files[3])

	// Glob metacharacters in the literal part are literal.
	odd := filepath.Join(t.TempDir(), "run[1]")
	require.NoError(t, os.Mkdir(odd, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(odd, "iter.0.jsonl"), nil, 0o644))
	files, err = report.ExpandLogPaths([]string{filepath.Join(odd, "iter.{rank}.jsonl")})
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(odd, "iter.0.jsonl")}, files)

	code, _, errOut := calibrate(filepath.Join(t.TempDir(), "iter.{rank}.jsonl"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no file matches")
}

func TestCalibrateYAMLAndJSON(t *testing.T) {
	dir := workedExampleLogs(t, 20)
	logs := filepath.Join(dir, "iter.{rank}.jsonl")

	code, out, errOut := calibrate("--yaml", logs)
	require.Equal(t, 0, code, errOut)
	var snippet struct {
		Scheduler struct {
			EqualCost map[string]int64 `yaml:"equal_cost"`
		} `yaml:"scheduler"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(out), &snippet), out)
	assert.Equal(t, map[string]int64{"kv_cost_offset": 140000, "kv_depth_threshold": 445000}, snippet.Scheduler.EqualCost)

	code, out, errOut = calibrate("--json", logs)
	require.Equal(t, 0, code, errOut)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	for _, k := range []string{"options", "records", "ranks", "iterations", "spans", "samples", "slope_ms_per_kv", "c2",
		"intercept_ms", "offset_lo", "offset_hi", "kv_cost_offset", "linearity", "threshold_raw", "kv_depth_threshold",
		"depths", "waste_mean", "waste_p90", "waste_iterations", "gain_p50"} {
		assert.Contains(t, res, k)
	}
	assert.Equal(t, 140000.0, res["kv_cost_offset"])
	assert.Equal(t, 445000.0, res["kv_depth_threshold"])
	assert.Len(t, res["samples"], 19)
	assert.Len(t, res["linearity"], 3)

	code, _, _ = calibrate("--yaml", "--json", logs)
	assert.Equal(t, 2, code)
}

func TestCalibratePlot(t *testing.T) {
	dir := workedExampleLogs(t, 20)
	out := filepath.Join(t.TempDir(), "cal.png")
	code, stdout, errOut := calibrate("--plot", out, filepath.Join(dir, "iter.{rank}.jsonl"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, stdout, "export TLLM_V2_CTX_COST_KV_OFFSET=140000", "the report still prints")
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	assert.Equal(t, []int{1600, 640}, []int{cfg.Width, cfg.Height})
	st, err := os.Stat(out)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(10_000), "a drawn plot, not an empty canvas")
}

// TestCalibrateRecoversKnownCost fits noisy synthetic logs of four ranks
// whose true cost is known: every rank's full chunk at depth kv costs
// trueA + trueSlope·kv, the lockstep time is the largest over ranks, and each
// rank reports it with ±2 % noise. Now and then one rank serves a deep
// request (819 200 tokens) while the others serve medium ones: its deep
// iterations are the monopoly spans. The recommended offset must land within
// 10 % of 0.825 · trueA / trueSlope (the centre of §8.2's [0.65, 1] · A/slope)
// and the threshold within 10 % of the true median midpoint depth.
func TestCalibrateRecoversKnownCost(t *testing.T) {
	const (
		ranks, iters = 4, 600
		trueA        = 1200.0 // ms
		trueSlope    = 0.0075 // ms per KV token at N = M
		deepChunks   = 100
	)
	rng := rand.New(rand.NewPCG(42, 43))
	type req struct {
		id         uint64
		chunks, at int
	}
	cur := make([]req, ranks)
	nextID := uint64(1)
	deepRank := -1
	newReq := func(r int) req {
		n := 8 + rng.IntN(33) // medium: 8..40 chunks
		if deepRank < 0 && rng.Float64() < 0.1 {
			n, deepRank = deepChunks, r
		}
		nextID++
		return req{id: nextID, chunks: n}
	}
	for r := range cur {
		cur[r] = newReq(r)
	}
	byRank := make([][]executor.IterRecord, ranks)
	var trueDepths []float64
	for it := range int64(iters) {
		kv := make([]int, ranks)
		var lockstep float64
		for r := range ranks {
			kv[r] = cur[r].at * calM
			lockstep = max(lockstep, trueA+trueSlope*float64(kv[r]))
			if it >= 5 {
				trueDepths = append(trueDepths, float64(kv[r])+calM/2)
			}
		}
		for r := range ranks {
			dev := lockstep * (0.98 + 0.04*rng.Float64())
			byRank[r] = append(byRank[r], logChunk(r, it, dev, cur[r].id, kv[r]))
			if cur[r].at++; cur[r].at == cur[r].chunks {
				if deepRank == r {
					deepRank = -1
				}
				cur[r] = newReq(r)
			}
		}
	}
	dir := t.TempDir()
	writeLogs(t, dir, byRank)

	code, out, errOut := calibrate("--json", filepath.Join(dir, "iter.{rank}.jsonl"))
	require.Equal(t, 0, code, errOut)
	var res struct {
		Spans     []json.RawMessage `json:"spans"`
		OffsetHi  float64           `json:"offset_hi"`
		Offset    float64           `json:"kv_cost_offset"`
		Threshold float64           `json:"kv_depth_threshold"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.GreaterOrEqual(t, len(res.Spans), 2, "the generator must produce several deep episodes")
	assert.InEpsilon(t, trueA/trueSlope, res.OffsetHi, 0.10)
	assert.InEpsilon(t, 0.825*trueA/trueSlope, res.Offset, 0.10)
	slices.Sort(trueDepths)
	assert.InEpsilon(t, trueDepths[len(trueDepths)/2], res.Threshold, 0.10)
}

// TestCalibrateDenseTwinFleet (issue 23, defect 16): the logs of a dense
// model's attention-DP fleet on the twin fit the twin's own attention
// slope. Before fleet_device_ms the fit read each rank's own device time,
// which leaves the lockstep wait out, and found a slope of 0.
func TestCalibrateDenseTwinFleet(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join("..", "..", "..", "shared", "data", "mooncake", "conversation_trace.jsonl")
	logs := filepath.Join(dir, "it.{rank}.jsonl")
	t.Setenv("TLLM_PROFILE_LOG_RANKS", "all")
	var out, errb bytes.Buffer
	code := run([]string{"run", "--engine", "twin", "--gpu", "h200", "--model", "llama-8b", "--ranks", "4", "--pages", "0",
		"--context-only", "--trace", trace, "--limit", "300", "--iter-log", logs, "--progress", "off"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	code, res, errOut := calibrate("--json", "--max-num-tokens", "1024", logs)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, errOut, "warning")
	var got struct {
		Slope float64 `json:"slope_ms_per_kv"`
	}
	require.NoError(t, json.Unmarshal([]byte(res), &got), res)

	// The twin's true slope: a 1024-token chunk's cost per KV token of depth.
	p, err := twin.BuiltinProfile("h200", "llama-8b", twin.Parallelism{TP: 1, EP: 1})
	require.NoError(t, err)
	cost := func(kv int) float64 { return p.StepCost([]twin.Work{{NewTokens: 1024, KVBefore: kv}}).MS() }
	want := (cost(200_000) - cost(0)) / 200_000
	require.InEpsilon(t, want, got.Slope, 0.01, "fitted %g ms/kv, the twin's %g", got.Slope, want)

	// One rank's file alone is warned about.
	code, _, errOut = calibrate("--max-num-tokens", "1024", filepath.Join(dir, "it.0.jsonl"))
	require.Contains(t, errOut, "the logs hold rank 0 only", "exit %d", code)
}
