// Package report turns what a run produced into what a user reads: the run
// report (text, or JSON with --report json), the per-request records of
// --requests-out, latency Percentiles, the output digest, the calibration
// plot, and the readers of the per-rank iteration logs (which decode the
// executor's own record type, executor.IterRecord: one schema).
//
// It is shared by `worker run` and `worker serve` (through the fleet),
// `worker loadgen` (a replay against any server, in the same shape) and
// `worker eval`.
package report

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/workload"
)

// Percentiles of a latency distribution, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Report is the run summary (`--report json` prints it as is).
type Report struct {
	Engine string `json:"engine"`
	Model  string `json:"model"`
	// URL is the server `worker loadgen` measured (engine "remote").
	URL   string `json:"url,omitempty"`
	Ranks int    `json:"ranks"`
	// GPU is the GPU the twin models (--engine twin only).
	GPU string `json:"gpu,omitempty"`
	// Clock says which clock the latencies and throughputs use: "wall",
	// or "virtual" (the twin: modelled time, docs/twin.md).
	Clock string `json:"clock"`
	// DurationS is the run's duration on that clock (from the replay's start
	// to the last response); wall_s is always the real elapsed time.
	DurationS float64 `json:"duration_s"`
	Requests  struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Rejected  int `json:"rejected"`
		// NotSent and Cancelled are `worker loadgen`'s: requests that could
		// not start within --duration, and requests cut short (SIGINT, or
		// still running when --duration's grace ran out).
		NotSent   int `json:"not_sent,omitempty"`
		Cancelled int `json:"cancelled,omitempty"`
	} `json:"requests"`
	Tokens struct {
		Prompt    int64 `json:"prompt"`
		Generated int64 `json:"generated"`
	} `json:"tokens"`
	Iterations      int64       `json:"iterations"`
	IterationsTotal int64       `json:"iterations_total"`
	TTFTMS          Percentiles `json:"ttft_ms"`
	TPOTMS          Percentiles `json:"tpot_ms"`
	E2EMS           Percentiles `json:"e2e_ms"`
	LockstepWaste   float64     `json:"lockstep_waste"`
	// Balance (attention DP with two ranks or more; absent otherwise) is
	// the fleet's balance measured as TensorRT-LLM's ADP Balance write-up
	// does (docs/multi-rank.md, "Balance").
	Balance *Balance `json:"balance,omitempty"`
	// CPUContention is set when the ranks outnumbered the cores.
	CPUContention *CPUContention `json:"cpu_contention,omitempty"`
	Preemptions   struct {
		Suspended int `json:"suspended"`
		Recompute int `json:"recompute"`
	} `json:"preemptions"`
	Prefix        Prefix  `json:"prefix"`
	EventsDropped int64   `json:"events_dropped"`
	WallS         float64 `json:"wall_s"`
	OutputTokPerS float64 `json:"output_tokens_per_s"`
	// PrefillTokPerS counts the prompt tokens computed (not reused) per
	// second of duration_s.
	PrefillTokPerS float64 `json:"prefill_tokens_per_s"`
	// PromptTokPerS counts every prompt token of the completed requests,
	// reused prefix included, per second of duration_s: the prompt load
	// served, which a configuration that reuses more does not lose
	// (prefix.hit_rate is the reused share of the admitted prompts).
	PromptTokPerS   float64   `json:"prompt_tokens_per_s"`
	DeviceMSPerRank []float64 `json:"device_ms_per_rank"`
	// MoE (mixture-of-experts runs with expert parallelism): every rank's
	// time inside MoE exchanges summed (waiting for the slowest rank's layer
	// and moving tokens), and its share of every rank's device time summed;
	// device time less it is compute.
	MoEWaitMS    *float64 `json:"moe_wait_ms,omitempty"`
	MoEWaitShare *float64 `json:"moe_wait_share,omitempty"`
	OutputDigest string   `json:"output_digest"`
	// OutputDigestNote says why output_digest is empty (`worker loadgen`:
	// a response without token ids).
	OutputDigestNote string `json:"output_digest_note,omitempty"`
	// LatencyNote says why some latency percentiles are zeros that were not
	// measured (`worker loadgen`: no streamed chunk of any completed
	// response carried text or token ids, so no first token was seen).
	LatencyNote string `json:"latency_note,omitempty"`
	// RequestsPerS and InputTokPerS are `worker loadgen`'s: completed
	// requests and their prompt tokens per second of duration_s.
	RequestsPerS float64 `json:"requests_per_s,omitempty"`
	InputTokPerS float64 `json:"input_tokens_per_s,omitempty"`
	// Outputs are the completions of a prompt run (--prompt, --prompts).
	Outputs    []PromptOutput `json:"outputs,omitempty"`
	Rejections []Rejection    `json:"rejections"`
}

// Balance is how evenly the attention-DP ranks were loaded: the token
// balance ratio (per forward iteration mean/max over the ranks of the real
// tokens in their batch, averaged), the time balance (1 − lockstep_waste:
// mean/max of the ranks' busy time), and the speed-of-light output
// throughput sol = forward / sol_forward × output_tokens_per_s, where
// forward is Σ time_i over the forward iterations (the slowest rank's busy
// time) and sol_forward Σ time_i × token balance_i.
type Balance struct {
	TokenRatio     float64 `json:"token_ratio"`
	TimeRatio      float64 `json:"time_ratio"`
	Iterations     int64   `json:"iterations"`
	ForwardS       float64 `json:"forward_s"`
	SOLForwardS    float64 `json:"sol_forward_s"`
	SOLOutputTokPS float64 `json:"sol_output_tokens_per_s"`
	// ADPBalanceHeld counts the iterations in which ADP Balance held the
	// fleet's contexts (--attention-dp-balance; absent when it never did).
	ADPBalanceHeld int64 `json:"adp_balance_held_iterations,omitempty"`
	// CostLeveled counts the iterations in which cost leveling deferred some
	// rank's new prompts (--attention-dp-cost-leveling).
	CostLeveled int64 `json:"cost_leveling_deferred_iterations,omitempty"`
}

// Prefix is the radix reuse summary: reused prompt tokens / prompt
// tokens over every first-chunk admission (a recompute re-admission counts
// again with its longer prompt), and the blocks left in the trees.
type Prefix struct {
	HitRate      float64 `json:"hit_rate"`
	ReusedTokens int64   `json:"reused_tokens"`
	PromptTokens int64   `json:"prompt_tokens"`
	Admissions   int64   `json:"admissions"`
	LiveBlocks   int64   `json:"live_blocks"`
}

// Rejection is one request that was refused, and why.
type Rejection struct {
	Index  uint64 `json:"index"`
	Reason string `json:"reason"`
}

// RunInfo is what a report says about the run besides its requests: the
// fleet's configuration as the user named it, and what the fleet measured
// outside rank 0's result.
type RunInfo struct {
	Engine string
	Model  string // the model's name as reported (a checkpoint's own, or the twin's model)
	Ranks  int
	// GPU is the GPU a roofline twin models ("" otherwise).
	GPU string
	// VirtualEpoch is the twin's virtual clock's start; zero on a wall clock.
	VirtualEpoch time.Time
	// MoE: report the time inside MoE exchanges (expert parallelism).
	MoE bool
	// Outputs are a prompt run's decoded completions (nil otherwise).
	Outputs []PromptOutput
	// Wall is the run's real elapsed time; DeviceMSPerRank each rank's
	// device time.
	Wall            time.Duration
	DeviceMSPerRank []float64
	// RanksHere and Cores are the computing ranks that shared this node's
	// (or process's) cores and the cores they could use; set for an engine
	// that computes on the CPU, 0 otherwise. More ranks than cores make the
	// lockstep waste measure CPU contention rather than scheduling.
	RanksHere, Cores int
	// ThreadsPerRank is each rank's CPU engine threads (0 or 1: one).
	ThreadsPerRank int
}

// CPUContention says that a run's computing threads (ranks × each rank's
// CPU engine threads) outnumbered the cores they could use: its lockstep
// waste (and its latencies) then measure threads waiting for a core, not
// scheduling.
type CPUContention struct {
	Ranks          int `json:"ranks"`
	ThreadsPerRank int `json:"threads_per_rank"`
	Cores          int `json:"cores"`
}

// ByIndex returns the responses indexed by request id (= trace index),
// nil where n requests had no response.
func ByIndex(n int, responses []executor.Response) []*executor.Response {
	out := make([]*executor.Response, n)
	for i := range responses {
		r := &responses[i]
		if r.ID < uint64(len(out)) {
			out[r.ID] = r
		}
	}
	return out
}

// Build summarises a run of reqs from rank 0's result.
func Build(info RunInfo, reqs []workload.Request, rank0 *executor.Result) *Report {
	rep := &Report{Engine: info.Engine, Model: info.Model, Ranks: info.Ranks, GPU: info.GPU, Clock: "wall",
		Rejections: []Rejection{}, Outputs: info.Outputs}
	if !info.VirtualEpoch.IsZero() {
		rep.Clock = "virtual"
	}
	rep.Requests.Total = len(reqs)
	rep.Iterations = rank0.ForwardIterations
	rep.IterationsTotal = rank0.Iterations
	rep.LockstepWaste = Round(rank0.LockstepWaste, 4)
	if threads := max(info.ThreadsPerRank, 1); info.Cores > 0 && info.RanksHere*threads > info.Cores {
		rep.CPUContention = &CPUContention{Ranks: info.RanksHere, ThreadsPerRank: threads, Cores: info.Cores}
	}
	ps := rank0.Prefix
	rep.Prefix = Prefix{ReusedTokens: ps.ReusedTokens, PromptTokens: ps.PromptTokens, Admissions: ps.Admissions,
		LiveBlocks: rank0.LiveBlocks}
	if ps.PromptTokens > 0 {
		rep.Prefix.HitRate = Round(float64(ps.ReusedTokens)/float64(ps.PromptTokens), 4)
	}
	rep.EventsDropped = rank0.EventsDropped
	rep.WallS = Round(info.Wall.Seconds(), 3)
	if info.MoE {
		w, share := Round(rank0.FleetMoEWaitMS, 3), 0.0
		if rank0.FleetDeviceMS > 0 {
			share = Round(rank0.FleetMoEWaitMS/rank0.FleetDeviceMS, 4)
		}
		rep.MoEWaitMS, rep.MoEWaitShare = &w, &share
	}
	for _, d := range info.DeviceMSPerRank {
		rep.DeviceMSPerRank = append(rep.DeviceMSPerRank, Round(d, 3))
	}
	resp := ByIndex(len(reqs), rank0.Responses)
	rep.addResponses(reqs, resp)
	rep.DurationS = rep.WallS
	if rep.Clock == "virtual" {
		rep.DurationS = Round(rank0.VirtualEnd.Sub(info.VirtualEpoch).Seconds(), 3)
	}
	if rep.DurationS > 0 {
		rep.OutputTokPerS = Round(float64(rep.Tokens.Generated)/rep.DurationS, 1)
		rep.PrefillTokPerS = Round(float64(ps.PromptTokens-ps.ReusedTokens)/rep.DurationS, 1)
		rep.PromptTokPerS = Round(float64(rep.Tokens.Prompt)/rep.DurationS, 1)
	}
	if info.Ranks > 1 && rank0.BalanceIterations > 0 {
		b := &Balance{TokenRatio: Round(rank0.TokenBalance, 4), TimeRatio: Round(1-rank0.LockstepWaste, 4),
			Iterations: rank0.BalanceIterations, ForwardS: Round(rank0.ForwardMS/1000, 3),
			SOLForwardS: Round(rank0.SOLForwardMS/1000, 3), ADPBalanceHeld: rank0.ADPBalanceHeld,
			CostLeveled: rank0.CostLeveled}
		if rank0.SOLForwardMS > 0 {
			b.SOLOutputTokPS = Round(rank0.ForwardMS/rank0.SOLForwardMS*rep.OutputTokPerS, 1)
		}
		rep.Balance = b
	}
	rep.OutputDigest = OutputDigest(resp)
	return rep
}

// addResponses counts the requests' outcomes, tokens, preemptions and
// latencies (resp[i] is request i's response, nil when it has none).
func (rep *Report) addResponses(reqs []workload.Request, resp []*executor.Response) {
	var ttft, tpot, e2e []float64
	for i := range reqs {
		r := resp[i]
		if r == nil {
			continue
		}
		if r.Error != "" {
			rep.Requests.Rejected++
			rep.Rejections = append(rep.Rejections, Rejection{Index: r.ID, Reason: r.Error})
			continue
		}
		rep.Requests.Completed++
		// Prompt tokens count served requests only, like generated tokens:
		// a rejected request's (scaled) prompt may be billions of tokens
		// that never existed.
		rep.Tokens.Prompt += int64(reqs[i].Len())
		rep.Tokens.Generated += int64(len(r.Output))
		rep.Preemptions.Suspended += r.Suspended
		rep.Preemptions.Recompute += r.Recomputed
		ttft = append(ttft, MSBetween(r.ArrivalUnixNS, r.FirstTokenUnixNS))
		e2e = append(e2e, MSBetween(r.ArrivalUnixNS, r.FinishUnixNS))
		if len(r.Output) > 1 {
			tpot = append(tpot, MSBetween(r.FirstTokenUnixNS, r.FinishUnixNS)/float64(len(r.Output)-1))
		}
	}
	rep.TTFTMS, rep.TPOTMS, rep.E2EMS = Pct(ttft), Pct(tpot), Pct(e2e)
}

// OutputDigest is SHA-256 over the requests in trace order (DigestOutputs):
// a rejected or missing request contributes its index and length 0.
func OutputDigest(resp []*executor.Response) string {
	return DigestOutputs(len(resp), func(i int) []int32 {
		if r := resp[i]; r != nil && r.Error == "" {
			return r.Output
		}
		return nil
	})
}

// DigestOutputs is SHA-256 over n requests in trace order: each request's
// trace index (u64 LE), its output length (u32 LE) and its token ids (u32
// LE), where out(i) is request i's output (nil: rejected, missing or not
// sent). `worker run` and `worker loadgen` both use it, so a replay of the
// same trace on lockstep's server digests to the same value as the run.
func DigestOutputs(n int, out func(i int) []int32) string {
	h := sha256.New()
	var buf []byte
	for i := range n {
		o := out(i)
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(i))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(o)))
		for _, t := range o {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// MSBetween is the latency from a to b (Unix nanoseconds) in milliseconds,
// never negative: a wall clock stepped backwards reads as 0, and the
// difference is taken in uint64, where b − a cannot overflow for b ≥ a
// (int64 subtraction wrapped for stamps more than 292 years apart).
func MSBetween(a, b int64) float64 {
	if b < a {
		return 0
	}
	return float64(uint64(b)-uint64(a)) / 1e6
}

// Unanswered is the run's error when some request was neither served, nor
// rejected with its reason, nor (`worker loadgen`) left unsent or cancelled:
// one the fleet lost, which is a bug to report, never a figure to read past
// (a run once printed "12 total, 8 completed, 0 rejected" and exited 0).
func (rep *Report) Unanswered() error {
	q := rep.Requests
	if lost := q.Total - q.Completed - q.Rejected - q.NotSent - q.Cancelled; lost > 0 {
		return fmt.Errorf("%d of %d requests were never answered (neither served nor rejected): lost by the fleet, a bug",
			lost, q.Total)
	}
	return nil
}

// NothingServed is the run's error when requests were given but none
// completed (every one was rejected or lost), after the report is printed.
// Runs whose pool is known up front fail earlier, before any rank starts.
func (rep *Report) NothingServed() error {
	if rep.Requests.Total == 0 || rep.Requests.Completed > 0 {
		return nil
	}
	first := ""
	if len(rep.Rejections) > 0 {
		first = fmt.Sprintf(" (first: request %d: %s)", rep.Rejections[0].Index, rep.Rejections[0].Reason)
	}
	return fmt.Errorf("no request was served: %d of %d rejected%s", rep.Requests.Rejected, rep.Requests.Total, first)
}

// Pct computes nearest-rank percentiles (it sorts v).
func Pct(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	sort.Float64s(v)
	at := func(p float64) float64 {
		k := int(math.Ceil(p/100*float64(len(v)))) - 1
		k = max(0, min(k, len(v)-1))
		return Round(v[k], 3)
	}
	return Percentiles{P50: at(50), P90: at(90), P99: at(99)}
}

// Round rounds x to digits decimal digits.
func Round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// WriteJSON prints the report as indented JSON (--report json).
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText prints the report as text.
func (rep *Report) WriteText(w io.Writer) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("lockstep run report\n")
	p("  engine %s, model %s, %d ranks", rep.Engine, rep.Model, rep.Ranks)
	if rep.GPU != "" {
		p(", gpu %s", rep.GPU)
	}
	p(", %s clock\n", rep.Clock)
	p("  requests     %d total, %d completed, %d rejected\n", rep.Requests.Total, rep.Requests.Completed, rep.Requests.Rejected)
	p("  tokens       %d prompt, %d generated\n", rep.Tokens.Prompt, rep.Tokens.Generated)
	p("  iterations   %d with a forward (%d in all)\n", rep.Iterations, rep.IterationsTotal)
	if rep.Clock == "virtual" {
		p("  virtual time %.2f s (modelled), %.1f output tokens/s, %.1f prefill tokens/s computed (%.1f prompt tokens/s served); wall %.2f s\n",
			rep.DurationS, rep.OutputTokPerS, rep.PrefillTokPerS, rep.PromptTokPerS, rep.WallS)
	} else {
		p("  wall         %.2f s, %.1f output tokens/s, %.1f prefill tokens/s computed (%.1f prompt tokens/s served)\n",
			rep.WallS, rep.OutputTokPerS, rep.PrefillTokPerS, rep.PromptTokPerS)
	}
	rep.WriteLatencies(w)
	p("  lockstep waste %.1f%% (mean over forward iterations of 1 - mean/max rank busy time)\n", 100*rep.LockstepWaste)
	if b := rep.Balance; b != nil {
		p("  balance      tokens %.1f%%, time %.1f%% (mean/max over the ranks per forward); speed of light %.1f output tokens/s\n",
			100*b.TokenRatio, 100*b.TimeRatio, b.SOLOutputTokPS)
		if b.ADPBalanceHeld > 0 {
			p("               ADP Balance held the contexts in %d iterations\n", b.ADPBalanceHeld)
		}
		if b.CostLeveled > 0 {
			p("               cost leveling deferred new prompts in %d iterations\n", b.CostLeveled)
		}
	}
	if c := rep.CPUContention; c != nil {
		if c.ThreadsPerRank > 1 {
			p("               (%d ranks × %d threads shared %d cores here: the waste measures threads waiting for a core, not scheduling)\n",
				c.Ranks, c.ThreadsPerRank, c.Cores)
		} else {
			p("               (%d ranks shared %d cores here: the waste measures ranks waiting for a core, not scheduling)\n", c.Ranks, c.Cores)
		}
	}
	p("  preemptions  %d suspended, %d recompute\n", rep.Preemptions.Suspended, rep.Preemptions.Recompute)
	p("  prefix reuse %.1f%% of prompt tokens (%d reused of %d)\n", 100*rep.Prefix.HitRate, rep.Prefix.ReusedTokens, rep.Prefix.PromptTokens)
	for _, r := range rep.Rejections {
		p("  rejected #%d: %s\n", r.Index, r.Reason)
	}
	p("  output digest %s\n", rep.OutputDigest)
	return nil
}

// WriteLatencies prints the TTFT, TPOT and E2E Percentiles as a table.
func (rep *Report) WriteLatencies(w io.Writer) {
	fmt.Fprintf(w, "  latency (ms)      p50        p90        p99\n")
	for _, row := range []struct {
		name string
		v    Percentiles
	}{{"TTFT", rep.TTFTMS}, {"TPOT", rep.TPOTMS}, {"E2E", rep.E2EMS}} {
		fmt.Fprintf(w, "    %-8s %10.2f %10.2f %10.2f\n", row.name, row.v.P50, row.v.P90, row.v.P99)
	}
}

// RequestRecord is one line of --requests-out.
type RequestRecord struct {
	Index        int     `json:"index"`
	Rank         int     `json:"rank"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	TTFTMS       float64 `json:"ttft_ms"`
	TPOTMS       float64 `json:"tpot_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	Suspended    int     `json:"suspended"`
	Recomputed   int     `json:"recomputed"`
	// ReusedTokens is the prompt prefix the first admission reused from the
	// radix cache; prompt_tokens − reused_tokens is the uncached prompt.
	ReusedTokens int     `json:"reused_tokens"`
	Output       []int32 `json:"output"`
	Error        string  `json:"error,omitempty"`
}

// WriteRequests writes one JSON line per request of the trace, in trace
// order (--requests-out), from rank 0's responses.
func WriteRequests(w io.Writer, reqs []workload.Request, responses []executor.Response) error {
	enc := json.NewEncoder(w)
	for i, r := range ByIndex(len(reqs), responses) {
		rec := RequestRecord{Index: i, Rank: executor.NoRank, PromptTokens: reqs[i].Len(), Output: []int32{}}
		if r != nil {
			rec.Rank, rec.Error, rec.Suspended, rec.Recomputed, rec.ReusedTokens = r.Rank, r.Error, r.Suspended, r.Recomputed, r.ReusedTokens
			if r.Error == "" {
				rec.Output = r.Output
				rec.OutputTokens = len(r.Output)
				rec.TTFTMS = Round(MSBetween(r.ArrivalUnixNS, r.FirstTokenUnixNS), 3)
				rec.E2EMS = Round(MSBetween(r.ArrivalUnixNS, r.FinishUnixNS), 3)
				if len(r.Output) > 1 {
					rec.TPOTMS = Round(MSBetween(r.FirstTokenUnixNS, r.FinishUnixNS)/float64(len(r.Output)-1), 3)
				}
			}
		}
		if err := enc.Encode(rec); err != nil {
			return fmt.Errorf("--requests-out: %w", err)
		}
	}
	return nil
}
