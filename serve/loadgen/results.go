package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/lockstep-ai/lockstep/report"
)

// tpot is a completed streamed request's time per output token after the
// first.
func (r *Result) tpot() (float64, bool) {
	if !r.hasTTFT || r.outputTokens < 2 {
		return 0, false
	}
	return float64(r.e2e-r.ttft) / 1e6 / float64(r.outputTokens-1), true
}

func ms(d time.Duration) float64 { return report.Round(float64(d)/1e6, 3) }

// Report summarises a replay in `worker run`'s report shape.
func (g *Generator) Report(results []Result, wall time.Duration) *report.Report {
	rep := &report.Report{Engine: "remote", Model: g.model, URL: g.o.URL, Clock: "wall", Rejections: []report.Rejection{}}
	rep.Requests.Total = len(results)
	var ttft, tpot, e2e []float64
	var last time.Duration
	missingIDs := 0
	for i := range results {
		r := &results[i]
		switch r.state {
		case notSent:
			rep.Requests.NotSent++
			continue
		case cancelled:
			rep.Requests.Cancelled++
			continue
		case rejected:
			rep.Requests.Rejected++
			rep.Rejections = append(rep.Rejections, report.Rejection{Index: uint64(i), Reason: r.err})
			continue
		}
		rep.Requests.Completed++
		last = max(last, r.end)
		rep.Tokens.Prompt += int64(r.promptTokens)
		rep.Tokens.Generated += int64(r.outputTokens)
		e2e = append(e2e, float64(r.e2e)/1e6)
		if r.hasTTFT {
			ttft = append(ttft, float64(r.ttft)/1e6)
		}
		if v, ok := r.tpot(); ok {
			tpot = append(tpot, v)
		}
		if !r.idsKnown {
			missingIDs++
		}
	}
	rep.TTFTMS, rep.TPOTMS, rep.E2EMS = report.Pct(ttft), report.Pct(tpot), report.Pct(e2e)
	if rep.Requests.Completed > 0 && len(ttft) == 0 {
		rep.LatencyNote = "no completed response streamed a chunk with text or token ids: ttft_ms and tpot_ms were not measured"
		if !g.o.Stream {
			rep.LatencyNote = "non-streamed requests (--stream=false): ttft_ms and tpot_ms were not measured"
		} else if !g.o.ReturnTokenIDs {
			rep.LatencyNote += " (a model without a tokenizer streams empty text: --return-token-ids)"
		}
	}
	rep.WallS = report.Round(wall.Seconds(), 3)
	rep.DurationS = report.Round(last.Seconds(), 3)
	if last > 0 {
		s := last.Seconds()
		rep.OutputTokPerS = report.Round(float64(rep.Tokens.Generated)/s, 1)
		rep.InputTokPerS = report.Round(float64(rep.Tokens.Prompt)/s, 1)
		rep.RequestsPerS = report.Round(float64(rep.Requests.Completed)/s, 3)
	}
	if missingIDs == 0 {
		rep.OutputDigest = report.DigestOutputs(len(results), func(i int) []int32 {
			if results[i].state == completed {
				return results[i].ids
			}
			return nil
		})
	} else {
		rep.OutputDigestNote = fmt.Sprintf("%d of %d completed responses carried no token ids", missingIDs, rep.Requests.Completed)
		if !g.o.ReturnTokenIDs {
			rep.OutputDigestNote += " (--return-token-ids asks lockstep's server for them)"
		}
	}
	if g.o.PromptsFile != "" {
		rep.Outputs = make([]report.PromptOutput, len(results))
		for i := range results {
			r := &results[i]
			p := report.PromptOutput{Index: i, Prompt: r.promptForReport, PromptTokens: r.promptTokens, Text: r.text,
				Tokens: r.outputTokens, FinishReason: r.finishReason}
			if r.state != completed {
				p.Error = r.err
				if p.Error == "" {
					p.Error = r.state.String()
				}
			}
			rep.Outputs[i] = p
		}
	}
	return rep
}

// maxListedTextRejections bounds the rejections the text report lists.
const maxListedTextRejections = 20

// WriteText prints a replay's report as text.
func (g *Generator) WriteText(w io.Writer, rep *report.Report) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	mode := "streamed"
	if !g.o.Stream {
		mode = "not streamed: E2E only"
	}
	p("lockstep loadgen report\n")
	p("  server %s, model %s, %s (%s), wall clock\n", rep.URL, rep.Model, g.path(), mode)
	p("  requests     %d total, %d completed, %d rejected", rep.Requests.Total, rep.Requests.Completed, rep.Requests.Rejected)
	if rep.Requests.NotSent > 0 {
		p(", %d not sent (--duration)", rep.Requests.NotSent)
	}
	if rep.Requests.Cancelled > 0 {
		p(", %d cancelled", rep.Requests.Cancelled)
	}
	p("\n")
	p("  tokens       %d prompt, %d generated\n", rep.Tokens.Prompt, rep.Tokens.Generated)
	p("  duration     %.2f s to the last response (wall %.2f s): %.2f requests/s, %.1f output tokens/s, %.1f input tokens/s\n",
		rep.DurationS, rep.WallS, rep.RequestsPerS, rep.OutputTokPerS, rep.InputTokPerS)
	rep.WriteLatencies(w)
	if rep.LatencyNote != "" {
		p("  latencies: %s\n", rep.LatencyNote)
	}
	for i, r := range rep.Rejections {
		if i == maxListedTextRejections {
			p("  ... and %d more rejected\n", len(rep.Rejections)-i)
			break
		}
		p("  rejected #%d: %s\n", r.Index, r.Reason)
	}
	if rep.OutputDigest != "" {
		p("  output digest %s\n", rep.OutputDigest)
	} else {
		p("  output digest none: %s\n", rep.OutputDigestNote)
	}
	return nil
}

// Record is one line of `worker loadgen --requests-out`.
type Record struct {
	Index int    `json:"index"`
	State string `json:"state"` // completed, rejected, cancelled or not_sent
	// ScheduledMS is when the request was due and SentMS when it was sent,
	// from the replay's start (queue_ms = the difference: --max-concurrency).
	ScheduledMS  float64 `json:"scheduled_ms"`
	SentMS       float64 `json:"sent_ms"`
	QueueMS      float64 `json:"queue_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	TTFTMS       float64 `json:"ttft_ms"`
	TPOTMS       float64 `json:"tpot_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	Output       []int32 `json:"output,omitempty"` // the token ids, when the server returned them
	Text         string  `json:"text,omitempty"`   // the completion (--prompts)
	FinishReason string  `json:"finish_reason,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// WriteRequests writes one Record per request, in trace order
// (--requests-out).
func (g *Generator) WriteRequests(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	for i := range results {
		r := &results[i]
		rec := Record{Index: i, State: r.state.String(), ScheduledMS: ms(g.reqs[i].arrival), Error: r.err}
		if r.state != notSent {
			rec.SentMS = ms(r.sent)
			rec.QueueMS = ms(max(0, r.sent-g.reqs[i].arrival))
			rec.PromptTokens = r.promptTokens
		}
		if r.state == completed {
			rec.OutputTokens, rec.E2EMS, rec.FinishReason = r.outputTokens, ms(r.e2e), r.finishReason
			if r.hasTTFT {
				rec.TTFTMS = ms(r.ttft)
			}
			if v, ok := r.tpot(); ok {
				rec.TPOTMS = report.Round(v, 3)
			}
			if r.idsKnown {
				rec.Output = r.ids
			}
			if g.o.PromptsFile != "" {
				rec.Text = r.text
			}
		}
		if err := enc.Encode(rec); err != nil {
			return fmt.Errorf("--requests-out: %w", err)
		}
	}
	return nil
}
