package twinval

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/workload"
)

// The end-to-end rows run the production fleet (router, scheduler,
// executor, KV pool, virtual clock) over the twin engine, configured as the
// published benchmark was: one attention-DP rank of tp GPUs, the
// benchmark's request count, lengths and arrival pattern, and
// trtllm-bench's own batch-size and token-budget rule.

// benchSettings are trtllm-bench's max batch size and max num tokens for a
// run, reimplemented from its documented rule (tensorrt_llm/bench/build/
// tuning.py, calc_engine_setting and finetune_setting, v1.0): the requests
// of isl + osl tokens that fit in 95 % of the memory left after the
// weights, capped at 4096; the token budget that many requests' share of
// isl/osl context tokens per generated token, capped at 32768; both rounded
// up "slightly optimistic" (batch to 32/128/256, at least 64; tokens to
// 256/512/1024, at least 2048). Memory in GiB as the tool computes it, with
// the twin's weight bytes and KV bytes per token.
func benchSettings(p *twin.Profile, isl, osl int) (maxBatch, maxTokens int) {
	const gib = 1 << 30
	tp := float64(p.Parallelism.TP)
	kvPerToken := p.KVBytesPerToken() * tp / gib // every GPU of the TP group
	available := (p.GPU.HBMBytes.Value - p.WeightBytesPerGPU()) * tp / gib
	requests := available * 0.95 / (kvPerToken * float64(isl+osl))
	rawBS := math.Min(requests, 4096)
	rawTok := math.Min(rawBS*(1+float64(isl)/float64(osl)), 32768)
	up := func(v, q float64) int { return int(q * math.Ceil(v/q)) }
	switch {
	case rawBS < 256:
		maxBatch = max(64, up(rawBS, 32))
	case rawBS < 1024:
		maxBatch = up(rawBS, 128)
	default:
		maxBatch = up(rawBS, 256)
	}
	switch {
	case rawTok < 4096:
		maxTokens = max(2048, up(rawTok, 256))
	case rawTok < 8192:
		maxTokens = up(rawTok, 512)
	default:
		maxTokens = up(rawTok, 1024)
	}
	return maxBatch, maxTokens
}

// unchunkedTokens is trtllm-bench's token budget with chunked prefill off,
// its PyTorch path's default (tensorrt_llm/bench/benchmark/utils/general.py,
// get_settings: chunking is enable_chunked_prefill, false unless the
// options turn it on, and then max_num_tokens is raised to max ISL + max
// batch size so that a whole prompt fits one step).
func unchunkedTokens(tokens, isl, maxBatch int) int { return max(tokens, isl+maxBatch) }

// writeTrace writes n requests of isl prompt tokens and osl output tokens
// arriving gapMS apart as a Mooncake trace: every prompt its own hash
// blocks (random prompts share no prefix), as the benchmarks' synthetic
// prompts.
func writeTrace(path string, n, isl, osl int, gapMS int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	blocks := (isl + workload.TraceBlockTokens - 1) / workload.TraceBlockTokens
	next := uint64(1)
	for i := 0; i < n; i++ {
		h := make([]uint64, blocks)
		for j := range h {
			h[j] = next
			next++
		}
		rec := workload.Record{TimestampMS: int64(i) * gapMS, InputLength: isl, OutputLength: osl, HashIDs: h}
		if err := enc.Encode(&rec); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// runFleet runs `worker run` with args over the trace in-process (no
// environment: TLLM_* variables and launchers do not apply) and returns its
// report.
func runFleet(args []string, log io.Writer) (*report.Report, error) {
	o, err := fleet.ParseArgs(args, log)
	if err != nil {
		return nil, err
	}
	out, err := fleet.Run(o, log, func(string) string { return "" })
	if err != nil {
		return nil, err
	}
	return out.Report, nil
}

// twinArgs are the run flags of one configuration.
func twinArgs(model, gpu string, tp int, weight, kv, trace string) []string {
	return []string{"--engine", "twin", "--model", model, "--gpu", gpu, "--tp", strconv.Itoa(tp),
		"--weight-dtype", weight, "--kv-dtype", kv, "--ranks", "1", "--pages", "0", "--tokens-per-page", "32",
		"--trace", trace, "--progress", "off", "--log-level", "error"}
}

// throughputRows are TensorRT-LLM's perf-overview rows: every request at
// once, trtllm-bench's batch and token budgets, the output tokens over the
// run's virtual duration. A non-nil only runs just those rows.
func throughputRows(dir string, only []int, log io.Writer) ([]Result, error) {
	t, err := readTable(fileTRTLLM)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i := range t.rows {
		if only != nil && !slices.Contains(only, i) {
			continue
		}
		r := t.row(i)
		model, gpu, tp := r.str("model"), r.str("gpu"), r.int("tp")
		weight, kv := r.str("weight_dtype"), r.str("kv_dtype")
		isl, osl, n, pub := r.int("isl"), r.int("osl"), r.int("requests"), r.num("output_tokens_per_s")
		if r.err != nil {
			return nil, r.err
		}
		p, err := profileFor(gpu, model, tp, twin.DType(weight), twin.DType(kv))
		if err != nil {
			return nil, fmt.Errorf("%s row %d: %w", t.name, i+1, err)
		}
		bs, tokens := benchSettings(p, isl, osl)
		tokens = unchunkedTokens(tokens, isl, bs)
		trace := filepath.Join(dir, fmt.Sprintf("trtllm-%d.jsonl", i))
		if err := writeTrace(trace, n, isl, osl, 0); err != nil {
			return nil, err
		}
		args := append(twinArgs(model, gpu, tp, weight, kv, trace), "--arrival-scale", "0", "--policy", "guaranteed_no_evict",
			"--chunked-prefill=false", "--max-batch-size", strconv.Itoa(bs), "--max-num-tokens", strconv.Itoa(tokens),
			"--max-active-per-rank", strconv.Itoa(max(bs, n)))
		rep, err := runFleet(args, log)
		if err != nil {
			return nil, fmt.Errorf("%s row %d (%s %s tp%d %d/%d): %w", t.name, i+1, model, gpu, tp, isl, osl, err)
		}
		if rep.Requests.Completed != n {
			return nil, fmt.Errorf("%s row %d: %d of %d requests completed", t.name, i+1, rep.Requests.Completed, n)
		}
		cfg := fmt.Sprintf("%s %s tp%d %s/%s %d/%d (batch %d, tokens %d)", model, gpu, tp, weight, kv, isl, osl, bs, tokens)
		out = append(out, Result{"trtllm-throughput", t.name, cfg, pub, rep.OutputTokPerS, "tokens/s"})
	}
	return out, nil
}

// latencyRows are the single-stream rows: one request alone on the rank
// (concurrency 1, batch 1), its time to first token and its time per
// output token after the first.
func latencyRows(dir string, log io.Writer) ([]Result, error) {
	t, err := readTable(fileLatency)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i := range t.rows {
		r := t.row(i)
		src, model, gpu, tp := r.str("source"), r.str("model"), r.str("gpu"), r.int("tp")
		weight, kv := r.str("weight_dtype"), r.str("kv_dtype")
		isl, osl, metric, pub := r.int("isl"), r.int("osl"), r.str("metric"), r.num("ms")
		if r.err != nil {
			return nil, r.err
		}
		trace := filepath.Join(dir, fmt.Sprintf("latency-%d.jsonl", i))
		if err := writeTrace(trace, 1, isl, osl, 0); err != nil {
			return nil, err
		}
		args := append(twinArgs(model, gpu, tp, weight, kv, trace), "--max-batch-size", "1", "--max-num-tokens", "8192")
		rep, err := runFleet(args, log)
		if err != nil {
			return nil, fmt.Errorf("%s row %d: %w", t.name, i+1, err)
		}
		var v float64
		switch metric {
		case "ttft":
			v = rep.TTFTMS.P50
		case "itl":
			v = rep.TPOTMS.P50
		default:
			return nil, fmt.Errorf("%s row %d: metric %q (want ttft or itl)", t.name, i+1, metric)
		}
		cfg := fmt.Sprintf("%s: %s %s tp%d %s/%s %d/%d %s", src, model, gpu, tp, weight, kv, isl, osl, metric)
		out = append(out, Result{"latency", t.name, cfg, pub, v, "ms"})
	}
	return out, nil
}
