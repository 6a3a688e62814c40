package eval

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/workload"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The evaluation's report directory: report.md (one table, the commands,
// the fit, what each plot shows), summary.json, and the PNG plots.

// configColours tell the configurations apart in every plot.
var configColours = map[string]color.RGBA{
	"A": {31, 119, 180, 255}, "B": {255, 127, 14, 255}, "C": {44, 160, 44, 255}, "D": {214, 39, 40, 255},
	"E": {148, 103, 189, 255}, "F": {140, 86, 75, 255}, "G": {23, 190, 207, 255},
	"H": {188, 189, 34, 255}, "I": {227, 119, 194, 255}, "J": {127, 127, 127, 255},
	"K": {0, 0, 0, 255}, "L": {0, 128, 128, 255},
}

// allConfigs are the configurations in report order.
var allConfigs = []string{"A", "B", "J", "C", "D", "E", "F", "G", "L", "H", "I", "K"}

// balanceConfigs are the configurations balance.png compares: without a
// balancing mode, with ADP Balance, with cost leveling, with both.
var balanceConfigs = []string{"A", "B", "E", "F", "H", "I", "K"}

// write writes report.md, summary.json and the plots.
func (ev *Evaluation) write() error {
	out := ev.opt.Out
	f, err := os.Create(filepath.Join(out, "summary.json"))
	if err != nil {
		return err
	}
	if err := ev.WriteSummary(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	plots := map[string]bool{}
	for _, m := range ev.models {
		for _, p := range []struct {
			name string
			draw func(string, string) (bool, error)
		}{
			{"goodput_vs_rate", ev.plotGoodput},
			{"latency_vs_rate", ev.plotLatency},
			{"ttft_cdf", ev.plotTTFT},
			{"timeline", ev.plotTimeline},
			{"waste", ev.plotWaste},
			{"balance", ev.plotBalance},
		} {
			name := plotName(p.name, m.Model)
			ok, err := p.draw(m.Model, filepath.Join(out, name))
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			plots[name] = ok
		}
	}
	return os.WriteFile(filepath.Join(out, "report.md"), []byte(ev.markdown(plots)), 0o644)
}

// plotName is the file of one model's plot.
func plotName(kind, model string) string { return kind + "-" + model + ".png" }

// topLoad is the label of the sweep's highest point.
func (ev *Evaluation) topLoad() string { return loadLabel(ev.opt.Sweep[len(ev.opt.Sweep)-1]) }

// find returns the run of a model, configuration, workload, load and engine.
func (ev *Evaluation) find(model, config, workload, load, engine string) *evalRun {
	for _, r := range ev.runs {
		if r.Model == model && r.Config == config && r.Workload == workload && r.Load == load && r.Engine == engine {
			return r
		}
	}
	return nil
}

// markdown renders report.md.
func (ev *Evaluation) markdown(plots map[string]bool) string {
	e := ev.opt
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# The scheduling policies on the twin: goodput against load, one change at a time\n\n")
	p("`%s` (%d runs, %.0f s of wall time, %d runs at once).\n\n", ev.commandLine(), len(ev.runs), ev.wall.Seconds(), e.Jobs)
	p("Where the time went:\n\n| part | wall (s) | runs | run time, summed (s) |\n|---|---|---|---|\n")
	for _, ph := range ev.phases {
		p("| %s | %.1f | %d | %.1f |\n", ph.Name, ph.WallS, ph.Runs, ph.RunS)
	}
	p("\n## What runs\n\nThe configurations form a ladder, each adding one thing to the one before; every ladder " +
		"configuration runs at every load of the sweep, on both workloads. The configurations beside the ladder add one " +
		"thing to A or B and run on aggregated serving only, where contexts and decodes share the ranks: ADP Balance at " +
		"every load, the others at the sweep's highest load.\n\n| config | adds | runs |\n|---|---|---|\n")
	for _, c := range allConfigs {
		if !slices.Contains(e.Configs, c) {
			continue
		}
		where := "every load, both workloads"
		switch {
		case inLadder(c):
		case strings.Contains(sweptBeside, c):
			where = "every load, aggregated serving"
		default:
			where = "aggregated serving, the highest load"
		}
		p("| **%s** | %s | %s |\n", c, stepOf(c), where)
	}
	p("\nA's token budget is M = %d; B's (O, D) is what `worker calibrate` fits from A's iteration logs on context servers; "+
		"J routes with conversations inferred from `hash_ids`; C demotes prompts of at least U = %d uncached tokens; D is "+
		"`--ctx-cost auto` (the online calibrator with the lockstep correction); ADP Balance is TensorRT-LLM's "+
		"`attention_dp_config` with its defaults (timeout_iters 50, batching_wait_iters 10); cost leveling is lockstep's own "+
		"(ranks keep new first chunks only up to the fleet's heaviest mandatory work); G places new conversations on the rank "+
		"with the fewest prompt tokens.\n\n", e.MaxNumTokens, e.Demote)
	p("Workloads: **context**: disaggregated context servers (every request generates its first token only; A's logs " +
		"come from here); **aggregated**: prefill and decode on the same ranks.\n\n")
	p("Loads: each workload's **capacity** is measured first, configuration A with every request of the slice at once, "+
		"in prompt tokens per second served (every prompt token of the completed requests, reused prefix included: the unit "+
		"the demand counts in). The sweep replays the slice at the arrival scale that offers **%s** times that capacity.\n\n",
		sweepText(e.Sweep))
	p("Goodput: the completed requests per second whose TTFT is at most **%v** and whose mean time per output token "+
		"(after the first) is at most **%v** (`--slo-ttft`, `--slo-tpot`; a context-server request has one output token, so "+
		"only its TTFT counts). The trace's prompts are long (a long prefill is at least %d uncached tokens), so the default "+
		"TTFT objective is 10 s, not the 1–2 s of chat benchmarks. The **knee** is the highest swept rate whose goodput is at "+
		"least %.0f %% of the offered rate.\n\n", e.SLOTTFT, e.SLOTPOT, e.LongPrefill, 100*kneeShare)
	p("Other measures: **lockstep waste**, per forward iteration 1 − mean/max of the ranks' busy (modelled device) time, " +
		"mean and p90 over iterations; **token balance**, per forward iteration mean/max of the ranks' real tokens, averaged; " +
		"**time balance** = 1 − waste; **speed of light**, the output rate × Σ iteration time / Σ iteration time × token " +
		"balance (docs/multi-rank.md, \"Balance\"). **Prompt tok/s served** counts every prompt token with the reused share " +
		"beside it; **prefill tok/s computed** counts the tokens the ranks ran, recomputation included. Latencies are virtual " +
		"(the twin's clock).\n\n")
	for _, m := range ev.models {
		ev.modelSection(&b, m, plots)
	}
	if e.CPU {
		p("\n## CPU engine (real compute, wall clock)\n\nTwo in-process ranks of the tiny model on the first 160 requests " +
			"(lengths × 0.05), everything arriving at once, one run at a time. ")
		switch {
		case ev.cpuNote != "":
			p("%s. %s.\n\n", ev.cpuNote, cpuFitExplanation)
		case ev.cpuFit != nil && ev.cpuFit.result != nil:
			r := ev.cpuFit.result
			p("A's logs gave a fit this time (intercept %.2f ms, slope %.2f µs per KV token, O = %d, D = %d), but it is not "+
				"stable from run to run: other runs of the same command read a fixed cost at or below zero, and then B and C "+
				"are skipped. %s.\n\n", r.InterceptMS, 1000*r.SlopeMS, r.Offset, r.Threshold, cpuFitExplanation)
		default:
			p("\n\n")
		}
		ev.table(&b, "tiny", "cpu", "")
	}
	p("\n## Commands\n\n")
	for _, r := range ev.runs {
		p("- %s / %s / %s / %s (%s): `%s`\n", r.Model, r.Config, r.Workload, r.Load, r.Engine, r.Command)
	}
	return b.String()
}

// commandLine is the `worker eval` command of this evaluation.
func (ev *Evaluation) commandLine() string {
	e := ev.opt
	s := fmt.Sprintf("worker eval --engine twin --gpu %s --model %s --ranks %d --trace %s --limit %d --sweep %s --slo-ttft %v --slo-tpot %v",
		e.GPU, strings.Join(e.Models, ","), e.Ranks, e.Trace, e.Limit, sweepList(e.Sweep), e.SLOTTFT, e.SLOTPOT)
	if !slices.Equal(e.Configs, DefaultConfigs) {
		s += " --configs " + strings.Join(e.Configs, ",")
	}
	if a := e.deploymentArgs(); len(a) > 0 {
		s += " " + strings.Join(a, " ")
	}
	if e.Arrivals != workload.ArrivalsTrace {
		s += " --arrivals " + e.Arrivals
	}
	return s
}

func sweepList(x []float64) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

func sweepText(x []float64) string { return strings.ReplaceAll(sweepList(x), ",", ", ") }

// modelSection renders one model's part of the report.
func (ev *Evaluation) modelSection(b *strings.Builder, m *modelEval, plots map[string]bool) {
	e := ev.opt
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## %s on %d × %s\n\n", m.Model, e.Ranks, strings.ToUpper(e.GPU))
	if e.Arrivals == workload.ArrivalsPoisson {
		at := fmt.Sprintf("%d distinct arrival times, up to %d requests at one", m.Instants, m.MaxBurst)
		if m.MaxBurst == 1 {
			at = "every request at its own time"
		}
		p("The slice (%d requests over %.0f s) is replayed as a Poisson process at the trace's mean rate (`--arrivals "+
			"poisson`: the same requests in the same order, exponential gaps) and offers %.0f prompt tokens/s at that pace, "+
			"%s. Capacity: ", m.Requests, m.SpanS, m.Demand, at)
	} else {
		p("The slice (%d requests over %.0f s at the trace's pace) offers %.0f prompt tokens/s. It arrives in bursts: %d distinct "+
			"arrival times, up to %d requests at one. Scaling the arrivals stretches the gaps between bursts, never a burst, so "+
			"at the lowest loads the latencies stop falling: what remains is the cost of one burst alone (`--arrivals poisson` "+
			"replays the slice without them). Capacity: ",
			m.Requests, m.SpanS, m.Demand, m.Instants, m.MaxBurst)
	}
	for i, w := range []string{"context", "aggregated"} {
		if i > 0 {
			p("; ")
		}
		p("%s %.0f prompt tokens/s served (the trace's own pace is load %.2f)", w, m.Capacity[w], m.Demand/m.Capacity[w])
	}
	p(".\n\n")
	for _, w := range []string{"context", "aggregated"} {
		c, top := ev.find(m.Model, "capacity", w, "all-at-once", "twin"), ev.find(m.Model, "A", w, ev.topLoad(), "twin")
		if c != nil && top != nil {
			p("On %s, the capacity run completed %.3f requests/s with %d preemptions; A at %s of it is offered %.3f and "+
				"completes %.3f. ", w, c.ThroughputRPS, c.Preemptions, ev.topLoad(), top.OfferedRPS, top.ThroughputRPS)
		}
	}
	p("The capacity is the sweep's yardstick, not its limit: every request at once keeps every context server busy, " +
		"while arrivals over time leave ranks idle between bursts; on aggregated serving every request at once makes " +
		"MAX_UTILIZATION admit them all and recompute, which arrivals over time may not (then the top of the sweep is not " +
		"saturation).")
	p("\n\n### Knees\n\nThe highest swept rate with goodput ≥ %.0f %% of the offered rate (requests/s, and the load as a "+
		"multiple of the workload's capacity); \"below the sweep\" when even the lowest load misses it.\n\n"+
		"| config | adds | context servers | aggregated serving |\n|---|---|---|---|\n", 100*kneeShare)
	knees := ev.knees(m.Model)
	for _, c := range allConfigs {
		var cells []string
		for _, w := range []string{"context", "aggregated"} {
			cell := "—"
			for _, k := range knees {
				if k.Config == c && k.Workload == w {
					cell = kneeText(k, e.Sweep)
				}
			}
			cells = append(cells, cell)
		}
		if cells[0] != "—" || cells[1] != "—" {
			p("| %s | %s | %s | %s |\n", c, stepOf(c), cells[0], cells[1])
		}
	}
	for _, kind := range []string{"goodput_vs_rate", "latency_vs_rate"} {
		if name := plotName(kind, m.Model); plots[name] {
			p("\n![%s](%s)\n", kind, name)
		}
	}
	p("\nAbove: goodput against the offered rate (dashed: the offered rate itself and %.0f %% of it, the knee's line); "+
		"below: p90 TTFT on both workloads and p90 TPOT on aggregated serving against the offered rate, log scale, the "+
		"objective dashed. One line per configuration swept (the ladder, and ADP Balance on aggregated serving).\n\n", 100*kneeShare)
	p("### The sweep\n\n| config | workload | load | offered req/s | completed req/s | goodput req/s (share) | TTFT p50 / p90 / p99 (s) | TPOT p50 / p90 / p99 (ms) | E2E p50 / p90 / p99 (s) | waste | prompt tok/s served (reused) | preempt |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range []string{"context", "aggregated"} {
		for _, c := range allConfigs {
			for _, r := range ev.sweepRuns(m.Model, c, w) {
				share := 0.0
				if r.OfferedRPS > 0 {
					share = r.GoodputRPS / r.OfferedRPS
				}
				p("| %s | %s | %s | %.3f | %.3f | %.3f (%.0f %%) | %s | %s | %s | %.1f %% | %.0f (%.1f %%) | %d |\n",
					r.Config, r.Workload, r.Load, r.OfferedRPS, r.ThroughputRPS, r.GoodputRPS, 100*share,
					secs(r.TTFT), trio(r.TPOT), secs(r.E2E), 100*r.WasteMean, r.PromptTokPerS, 100*r.ReusedShare, r.Preemptions)
			}
		}
	}
	p("\n### At the highest load (%s of capacity), every configuration\n\n", ev.topLoad())
	ev.table(b, m.Model, "twin", ev.topLoad())
	if d := ev.find(m.Model, "D", "context", ev.topLoad(), "twin"); d != nil {
		p("\n%s\n", ev.calibratorText(m.Model))
	}
	if m.fit != nil {
		p("\n### Calibration (from A on context servers at %s)\n\n", ev.topLoad())
		if m.fit.err != nil {
			p("No fit: %v. The configurations that need it (B, J, C, F, G, I) were not run.\n", m.fit.err)
		} else {
			p("`bin/worker calibrate --max-num-tokens %d '%s'`:\n\n```\n%s```\n\n![calibration](%s)\n\n"+
				"The calibration plot: left, the monopoly samples (one colour per span: the iteration time while one deep rank "+
				"holds the only full-budget chunk) with the fitted line T = A + slope·depth and the recommended threshold; "+
				"right, the token-weighted distribution of the context work's midpoint depth, whose percentile is D.\n",
				e.MaxNumTokens, m.fit.logs, m.fit.text, m.fit.plot)
		}
	}
	at := ev.topLoad()
	if name := plotName("ttft_cdf", m.Model); plots[name] {
		p("\n### TTFT at the highest load\n\n![TTFT CDFs](%s)\n\nTTFT CDFs of aggregated serving at %s, one line per "+
			"configuration: short turns on the left, long prefills on the right (log scale).\n", name, at)
	}
	if name := plotName("timeline", m.Model); plots[name] {
		p("\n### Lockstep timeline\n\n![timeline](%s)\n\nPer-rank busy time over 60 consecutive forward iterations "+
			"of context servers at %s (the window starts at the middle of the run), A beside B: one line per rank, the dashed "+
			"line is the slowest rank, which every rank waits for.\n", name, at)
	}
	if name := plotName("balance", m.Model); plots[name] {
		p("\n### Balance over iterations\n\n![balance](%s)\n\nThe token balance ratio (mean/max over the ranks of "+
			"the real tokens in their forward) over the forward iterations of aggregated serving at %s, a moving mean over 100 "+
			"iterations, one line per configuration (the measure of TensorRT-LLM's ADP Balance write-up, its Figures 3–6): A "+
			"and B without a balancing mode, E and F with ADP Balance, H and I with cost leveling, K with both.\n", name, at)
	}
	if name := plotName("waste", m.Model); plots[name] {
		p("\n### Waste distribution\n\n![waste](%s)\n\nThe distribution (CDF) of the per-iteration lockstep waste of "+
			"each configuration at %s: context servers left, aggregated serving right.\n", name, at)
	}
	p("\n")
}

// kneeText renders one knee.
func kneeText(k knee, sweep []float64) string {
	if k.LoadX == 0 {
		return fmt.Sprintf("below the sweep (< %.2f×)", sweep[0])
	}
	s := fmt.Sprintf("%.3f req/s (%s)", k.RPS, loadLabel(k.LoadX))
	if k.LoadX == sweep[len(sweep)-1] {
		s += ", the sweep's top: at or above"
	}
	if !k.Below {
		s += "; a lower load misses it"
	}
	return s
}

// calibratorText says whether D's online calibrator settled in each run.
func (ev *Evaluation) calibratorText(model string) string {
	var b strings.Builder
	b.WriteString("**D's online calibrator**: ")
	n := 0
	for _, r := range ev.runs {
		if r.Model != model || r.Config != "D" || r.Engine != "twin" {
			continue
		}
		if n > 0 {
			b.WriteString("; ")
		}
		n++
		if r.Published {
			pubs := "publications"
			if r.Publications == 1 {
				pubs = "publication"
			}
			fmt.Fprintf(&b, "%s %s: first published at iteration %d of %d (%d %s, last O = %d, D = %d)",
				r.Workload, r.Load, r.FirstPublication, r.Iterations, r.Publications, pubs, r.Offset, r.Threshold)
		} else {
			why := "it never refitted"
			if r.LastRefit != "" {
				why = "last refit: " + r.LastRefit
			}
			fmt.Fprintf(&b, "%s %s: never published in %d iterations, so it ran without a cap (%s)", r.Workload, r.Load, r.Iterations, why)
		}
	}
	b.WriteString(". A run whose first publication comes late in its iterations runs mostly uncapped: it did not settle.")
	return b.String()
}

// secs renders latency percentiles in seconds.
func secs(q report.Percentiles) string {
	f := func(v float64) string { return num(v / 1000) }
	return f(q.P50) + " / " + f(q.P90) + " / " + f(q.P99)
}

// table writes the figures of one model's runs on one engine (at one load, or all with "").
func (ev *Evaluation) table(b *strings.Builder, model, engine, load string) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("| config | workload | load | waste mean | waste p90 | token balance | time balance | prompt tok/s served (reused) | prefill tok/s computed | output tok/s | speed of light tok/s | TTFT short p50/p90/p99 (ms) | TTFT long p50/p90/p99 (ms) | E2E long p50 (ms) | TPOT p50/p90 (ms) | preempt | O, D |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range ev.runs {
		if r.Model != model || r.Engine != engine || r.Config == "capacity" || (load != "" && r.Load != load) {
			continue
		}
		od := "—"
		switch {
		case r.Config == "D" && r.Published:
			od = fmt.Sprintf("%d, %d (published)", r.Offset, r.Threshold)
		case r.Config == "D":
			od = "none published"
		case r.Offset > 0:
			od = fmt.Sprintf("%d, %d (fitted)", r.Offset, r.Threshold)
		}
		p("| %s | %s | %s | %.1f%% | %.1f%% | %.3f | %.3f | %.0f (%.1f%%) | %.0f | %.1f | %.1f | %s (%d) | %s (%d) | %s | %s | %d | %s |\n",
			r.Config, r.Workload, r.Load, 100*r.WasteMean, 100*r.WasteP90, r.TokenBalance, r.TimeBalance,
			r.PromptTokPerS, 100*r.ReusedShare, r.PrefillTokPerS,
			r.OutputTokPerS, r.SOLOutputTokPS,
			trio(r.TTFTShort), r.ShortN, trio(r.TTFTLong), r.LongN, num(r.E2ELong.P50), pair(r.TPOT), r.Preemptions, od)
	}
}

func num(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
func trio(q report.Percentiles) string { return num(q.P50) + " / " + num(q.P90) + " / " + num(q.P99) }
func pair(q report.Percentiles) string { return num(q.P50) + " / " + num(q.P90) }

// plotTTFT: TTFT CDFs per configuration, short turns beside long prefills
// (aggregated workload, saturated load).
func (ev *Evaluation) plotTTFT(model, path string) (bool, error) {
	short, long := plot.New(), plot.New()
	short.Title.Text, long.Title.Text = model+": TTFT, short turns (aggregated, "+ev.topLoad()+")", model+": TTFT, long prefills (aggregated, "+ev.topLoad()+")"
	any := false
	for _, pl := range []*plot.Plot{short, long} {
		pl.X.Label.Text, pl.Y.Label.Text = "TTFT (ms, log scale)", "fraction of requests"
		pl.X.Scale, pl.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		pl.Y.Min, pl.Y.Max = 0, 1
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
	}
	for _, c := range allConfigs {
		r := ev.find(model, c, "aggregated", ev.topLoad(), "twin")
		if r == nil {
			continue
		}
		for _, side := range []struct {
			pl *plot.Plot
			v  []float64
		}{{short, r.ttftS}, {long, r.ttftL}} {
			pts := report.CDF(positive(side.v))
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return false, err
			}
			l.Color, l.Width = configColours[c], vg.Points(2)
			side.pl.Add(l)
			side.pl.Legend.Add(c, l)
			any = true
		}
	}
	if !any {
		return false, nil
	}
	return true, report.SavePlots(path, 1600, 640, short, long)
}

// positive drops values ≤ 0 (a log axis cannot show them).
func positive(v []float64) []float64 {
	out := make([]float64, 0, len(v))
	for _, x := range v {
		if x > 0 {
			out = append(out, x)
		}
	}
	return out
}

// plotTimeline: per-rank busy time over 60 consecutive forward iterations,
// A beside B (context servers, saturated load).
func (ev *Evaluation) plotTimeline(model, path string) (bool, error) {
	var panels []*plot.Plot
	yMax := 0.0
	for _, c := range []string{"A", "B"} {
		r := ev.find(model, c, "context", ev.topLoad(), "twin")
		if r == nil || len(r.busy) < 2 {
			continue
		}
		start := max(0, len(r.busy)/2-30)
		end := min(len(r.busy), start+60)
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s %s: per-rank busy time, forward iterations %d–%d (context servers, %s)", model, c, start, end-1, ev.topLoad())
		pl.X.Label.Text, pl.Y.Label.Text = "forward iteration", "busy time (ms)"
		pl.X.Tick.Marker = wholeTicks{}
		pl.Add(plotter.NewGrid())
		ranks := len(r.busy[start])
		for k := 0; k < ranks; k++ {
			pts := make(plotter.XYs, 0, end-start)
			for i := start; i < end; i++ {
				pts = append(pts, plotter.XY{X: float64(i), Y: float64(r.busy[i][k])})
				yMax = max(yMax, float64(r.busy[i][k]))
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return false, err
			}
			l.Color = report.SpanColours[k%len(report.SpanColours)]
			if k < 8 {
				pl.Legend.Add(fmt.Sprintf("rank %d", k), l)
			}
			pl.Add(l)
		}
		env := make(plotter.XYs, 0, end-start)
		for i := start; i < end; i++ {
			m := float32(0)
			for _, b := range r.busy[i] {
				m = max(m, b)
			}
			env = append(env, plotter.XY{X: float64(i), Y: float64(m)})
		}
		l, err := plotter.NewLine(env)
		if err != nil {
			return false, err
		}
		l.Color, l.Width, l.Dashes = color.RGBA{A: 255}, vg.Points(2), []vg.Length{vg.Points(5), vg.Points(3)}
		pl.Add(l)
		pl.Legend.Add("slowest rank (the iteration)", l)
		pl.Legend.Top = true
		panels = append(panels, pl)
	}
	if len(panels) == 0 {
		return false, nil
	}
	for _, pl := range panels {
		pl.Y.Min, pl.Y.Max = 0, yMax*1.45 // room for the legend
	}
	return true, report.SavePlots(path, 1600, 640, panels...)
}

// wholeTicks are gonum's default ticks labelled as whole numbers (iteration
// numbers): a label at a fraction is dropped, and "175.00" reads "175".
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		ts[i].Label = ""
		if v := ts[i].Value; v == math.Trunc(v) {
			ts[i].Label = strconv.FormatFloat(v, 'f', 0, 64)
		}
	}
	return ts
}

// plotWaste: CDFs of the per-iteration lockstep waste per configuration,
// context servers beside aggregated serving (saturated load).
func (ev *Evaluation) plotWaste(model, path string) (bool, error) {
	var panels []*plot.Plot
	for _, w := range []string{"context", "aggregated"} {
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s: per-iteration lockstep waste (%s, %s)", model, w, ev.topLoad())
		pl.X.Label.Text, pl.Y.Label.Text = "waste: 1 − mean/max busy time over ranks", "fraction of forward iterations"
		pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = 0, 1, 0, 1
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
		n := 0
		for _, c := range allConfigs {
			r := ev.find(model, c, w, ev.topLoad(), "twin")
			if r == nil || len(r.waste) == 0 {
				continue
			}
			l, err := plotter.NewLine(report.CDF(r.waste))
			if err != nil {
				return false, err
			}
			l.Color, l.Width = configColours[c], vg.Points(2)
			pl.Add(l)
			pl.Legend.Add(fmt.Sprintf("%s (mean %.0f%%)", c, 100*r.WasteMean), l)
			n++
		}
		if n > 0 {
			panels = append(panels, pl)
		}
	}
	if len(panels) == 0 {
		return false, nil
	}
	return true, report.SavePlots(path, 1600, 640, panels...)
}

// plotBalance: the token balance ratio over forward iterations per
// configuration (aggregated serving, saturated load), a moving mean over
// 100 iterations.
func (ev *Evaluation) plotBalance(model, path string) (bool, error) {
	pl := plot.New()
	pl.Title.Text = model + ": token balance ratio over forward iterations (aggregated, " + ev.topLoad() + "; moving mean of 100)"
	pl.X.Label.Text, pl.Y.Label.Text = "forward iteration", "mean/max of the ranks' tokens"
	pl.Y.Min, pl.Y.Max = 0, 1.3 // room for the legend
	pl.Add(plotter.NewGrid())
	pl.Legend.Top = true
	n := 0
	for _, c := range balanceConfigs {
		r := ev.find(model, c, "aggregated", ev.topLoad(), "twin")
		if r == nil || len(r.tokBal) == 0 {
			continue
		}
		const window = 100
		pts := make(plotter.XYs, 0, len(r.tokBal))
		sum := 0.0
		for i, v := range r.tokBal {
			sum += v
			if i >= window {
				sum -= r.tokBal[i-window]
			}
			pts = append(pts, plotter.XY{X: float64(i), Y: sum / float64(min(i+1, window))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return false, err
		}
		l.Color, l.Width = configColours[c], vg.Points(1.5)
		pl.Add(l)
		pl.Legend.Add(fmt.Sprintf("%s (mean %.2f)", c, r.TokenBalance), l)
		n++
	}
	if n == 0 {
		return false, nil
	}
	return true, report.SavePlots(path, 1600, 640, pl)
}

// cpuFitExplanation is why the CPU engine's logs give no offline fit.
const cpuFitExplanation = "Why: the tiny model's full 256-token chunk costs about 3 ms at depth 0 here, the attention over " +
	"the KV depth adds about 14 µs per KV token (60 ms at 4 000 tokens), and the wall-clock samples of two ranks sharing " +
	"two cores scatter by about 10 ms around that line. The offline fit reads the fixed cost off a few monopoly spans at " +
	"depth, so it extrapolates an intercept smaller than its own error (this time at or below zero), and `worker " +
	"calibrate` refuses a non-positive fixed cost rather than derive a cap from it. A least-squares line through all 300 " +
	"single-chunk iterations of one such run gives 5.7 ± 0.9 ms (docs/eval.md); the twin's clock has no such noise"
