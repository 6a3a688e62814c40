package costfit

import (
	"fmt"
	"io"
	"strings"
)

// Format writes the report of §8.3 to w, one line each, in the spec's order
// and number formats; the last two lines are the `export` lines a deployment
// pastes. When no iteration qualifies for the waste (none at or after the
// warm-up has context work on every rank), the waste and gain figures print
// as "n/a" and the count as 0.
func (r *Result) Format(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "records: %d ranks: %d iterations: %d\n", r.Records, r.Ranks, r.Iterations)
	fmt.Fprintf(&b, "monopoly spans: %d samples: %d\n", len(r.Spans), len(r.Samples))
	fmt.Fprintf(&b, "slope: %.3f us per KV token at N=%d (c2 = %.3e ms per token*KV)\n",
		1000*r.SlopeMS, r.Options.MaxNumTokens, r.C2)
	fmt.Fprintf(&b, "intercept: %.1f ms\n", r.InterceptMS)
	fmt.Fprintf(&b, "kv_cost_offset: range [%d, %d] recommended %d\n", roundInt(r.OffsetLo), roundInt(r.OffsetHi), r.Offset)
	for _, band := range r.Linearity {
		if band.Sufficient {
			fmt.Fprintf(&b, "linearity [%d, %d): %.3f us/kv\n", band.Lo, band.Hi, band.SlopeUS)
		} else {
			fmt.Fprintf(&b, "linearity [%d, %d): insufficient data\n", band.Lo, band.Hi)
		}
	}
	fmt.Fprintf(&b, "kv_depth_threshold: p%s = %d recommended %d\n", formatPercentile(r.Options.Percentile), roundInt(r.ThresholdRaw), r.Threshold)
	if r.WasteIterations > 0 {
		fmt.Fprintf(&b, "lockstep waste: mean %.1f%% p90 %.1f%% over %d iterations\n", 100*r.WasteMean, 100*r.WasteP90, r.WasteIterations)
		fmt.Fprintf(&b, "predicted gain (saturated upper bound): p50 %.2fx\n", r.GainP50)
	} else {
		fmt.Fprintf(&b, "lockstep waste: mean n/a p90 n/a over 0 iterations\n")
		fmt.Fprintf(&b, "predicted gain (saturated upper bound): p50 n/a\n")
	}
	fmt.Fprintf(&b, "export TLLM_V2_CTX_COST_KV_OFFSET=%d\n", r.Offset)
	fmt.Fprintf(&b, "export TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD=%d\n", r.Threshold)
	_, err := io.WriteString(w, b.String())
	return err
}

// formatPercentile prints p as given on the command line: "50", "12.5".
func formatPercentile(p float64) string {
	return fmt.Sprint(p)
}

// FormatYAML prints the fit as a config snippet for worker run's --config
// file (docs/config.md), with the figures it rests on as comments.
func (r *Result) FormatYAML(w io.Writer) error {
	_, err := fmt.Fprintf(w, `# worker calibrate: %d monopoly samples in %d spans over %d ranks;
# slope %.3f us per KV token at N=%d, intercept %.1f ms, kv_cost_offset range [%.0f, %.0f],
# kv_depth_threshold = p%v of the midpoint depths (%.0f).
scheduler:
  equal_cost:
    kv_cost_offset: %d
    kv_depth_threshold: %d
`, len(r.Samples), len(r.Spans), r.Ranks, 1000*r.SlopeMS, r.Options.MaxNumTokens, r.InterceptMS,
		r.OffsetLo, r.OffsetHi, r.Options.Percentile, r.ThresholdRaw, r.Offset, r.Threshold)
	return err
}
