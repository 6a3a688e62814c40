package eval

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lockstep-ai/lockstep/report"

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
}

// allConfigs are the configurations in report order.
var allConfigs = []string{"A", "B", "J", "C", "D", "E", "F", "G", "H", "I"}

// balanceConfigs are the configurations balance.png compares: without a
// balancing mode, with ADP Balance, with cost leveling.
var balanceConfigs = []string{"A", "B", "E", "F", "H", "I"}

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
	var plots []string
	for _, p := range []struct {
		name string
		draw func(string) (bool, error)
	}{
		{"ttft_cdf.png", ev.plotTTFT},
		{"timeline.png", ev.plotTimeline},
		{"waste.png", ev.plotWaste},
		{"balance.png", ev.plotBalance},
	} {
		ok, err := p.draw(filepath.Join(out, p.name))
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		if ok {
			plots = append(plots, p.name)
		}
	}
	return os.WriteFile(filepath.Join(out, "report.md"), []byte(ev.markdown(plots)), 0o644)
}

// find returns the run of a configuration, workload, load and engine.
func (ev *Evaluation) find(config, workload, load, engine string) *evalRun {
	for _, r := range ev.runs {
		if r.Config == config && r.Workload == workload && r.Load == load && r.Engine == engine {
			return r
		}
	}
	return nil
}

// markdown renders report.md.
func (ev *Evaluation) markdown(plots []string) string {
	e := ev.opt
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Equal-cost chunking, long-prefill demotion and the online calibrator on the twin\n\n")
	p("`worker eval --engine twin --gpu %s --model %s --ranks %d --trace %s --limit %d` (%.0f s of wall time).\n\n",
		e.GPU, e.Model, e.Ranks, e.Trace, e.Limit, ev.wall.Seconds())
	p("Configurations: **A** token budget only (M = %d); **B** equal-cost chunking with the (O, D) `worker calibrate` fitted "+
		"from A's iteration logs; **C** B + long-prefill demotion (U = %d uncached tokens) + the conversation-aware router "+
		"(conversations inferred from `hash_ids`); **D** C with `--ctx-cost auto` (the online calibrator with the lockstep "+
		"correction) instead of the fitted values; **E** A + ADP Balance (`--attention-dp-balance`, TensorRT-LLM's "+
		"`attention_dp_config` with its defaults: timeout_iters 50, batching_wait_iters 10), **F** B + ADP Balance and **G** C "+
		"with new conversations placed on the rank with the fewest prompt tokens (`--new-conv-placement least_tokens`); **H** A + "+
		"cost leveling (`--attention-dp-cost-leveling`, lockstep's own: ranks keep new first chunks only up to the fleet's "+
		"heaviest mandatory work) and **I** B + cost leveling; E–I on aggregated serving only; **J** B + the conversation-aware "+
		"router alone (C without demotion), so that the router's and demotion's effects each have a row (B → J → C).\n\n", e.MaxNumTokens, e.Demote)
	p("Workloads: **context** — disaggregated context servers (every request generates its first token only: prefill, as " +
		"on the ranks the calibration was designed on; A's logs come from this workload); **aggregated** — prefill and decode on " +
		"the same ranks.\n\n")
	p("Loads: the fleet's context capacity, measured with every request of the slice arriving at once on context servers "+
		"(configuration A), is **%.0f prompt tokens/s** served (every prompt token, reused prefix included: the unit the "+
		"demand counts in); the trace slice offers **%.0f prompt tokens/s** at its own pace "+
		"(load %.2f). The **saturated** runs replay it at `--arrival-scale %.4g` (offered load %.2f× the capacity).\n\n",
		ev.capacity, ev.demand, ev.demand/ev.capacity, ev.satScale, e.Saturation)
	p("Split: a **long prefill** is a request whose uncached prompt (prompt minus the prefix its first admission reused) is at "+
		"least %d tokens; every other request is a **short turn**.\n\n", e.LongPrefill)
	p("Lockstep waste: per forward iteration, 1 − mean/max of the ranks' busy (modelled device) time; mean and p90 over " +
		"iterations. Token balance: per forward iteration mean/max of the ranks' real tokens, averaged; time balance = " +
		"1 − waste; speed of light: the output rate × Σ iteration time / Σ iteration time × token balance (docs/multi-rank.md, " +
		"\"Balance\"). Latencies are virtual (the twin's clock).\n\n")
	ev.table(&b, "twin")
	if ev.fit != nil {
		p("\n## Calibration (from A on context servers)\n\n")
		if ev.fit.err != nil {
			p("No fit: %v. B and C were not run.\n", ev.fit.err)
		} else {
			p("`bin/worker calibrate --max-num-tokens %d '%s'`:\n\n```\n%s```\n\n![calibration](calibration.png)\n\n"+
				"The calibration plot: left, the monopoly samples (one colour per span: the iteration time while one deep rank "+
				"holds the only full-budget chunk) with the fitted line T = A + slope·depth and the recommended threshold; "+
				"right, the token-weighted distribution of the context work's midpoint depth, whose percentile is D.\n",
				e.MaxNumTokens, ev.fit.logs, ev.fit.text)
		}
	}
	if slices.Contains(plots, "ttft_cdf.png") {
		p("\n## TTFT\n\n![TTFT CDFs](ttft_cdf.png)\n\nTTFT CDFs of the aggregated workload at the saturated load, one line per " +
			"configuration: short turns on the left, long prefills on the right (log scale).\n")
	}
	if slices.Contains(plots, "timeline.png") {
		p("\n## Lockstep timeline\n\n![timeline](timeline.png)\n\nPer-rank busy time over 60 consecutive forward iterations " +
			"of context servers at the saturated load (the window starts at the middle of the run), A beside B: one line " +
			"per rank, the dashed line is the slowest rank, which every rank waits for.\n")
	}
	if slices.Contains(plots, "balance.png") {
		p("\n## Balance over iterations\n\n![balance](balance.png)\n\nThe token balance ratio (mean/max over the ranks of " +
			"the real tokens in their forward) over the forward iterations of the aggregated workload at the saturated load, " +
			"a moving mean over 100 iterations, one line per configuration (the measure of TensorRT-LLM's ADP Balance " +
			"write-up, its Figures 3–6): A and B without a balancing mode, E and F with ADP Balance, H and I with cost leveling.\n")
	}
	if slices.Contains(plots, "waste.png") {
		p("\n## Waste distribution\n\n![waste](waste.png)\n\nThe distribution (CDF) of the per-iteration lockstep waste of each " +
			"configuration at the saturated load: context servers left, aggregated serving right.\n")
	}
	if e.CPU {
		p("\n## CPU engine (real compute, wall clock)\n\nTwo in-process ranks of the tiny model on the first 160 requests " +
			"(lengths × 0.05), everything arriving at once. ")
		if ev.cpuNote != "" {
			p("%s.\n\n", ev.cpuNote)
		} else {
			p("\n\n")
		}
		ev.table(&b, "cpu")
	}
	p("\n## Commands\n\n")
	for _, r := range ev.runs {
		p("- %s / %s / %s (%s): `%s`\n", r.Config, r.Workload, r.Load, r.Engine, r.Command)
	}
	return b.String()
}

// table writes the figures of every run of one engine.
func (ev *Evaluation) table(b *strings.Builder, engine string) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("| config | workload | load | waste mean | waste p90 | token balance | time balance | prompt tok/s served (reused) | prefill tok/s computed | output tok/s | speed of light tok/s | TTFT short p50/p90/p99 (ms) | TTFT long p50/p90/p99 (ms) | E2E long p50 (ms) | TPOT p50/p90 (ms) | preempt | O, D |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range ev.runs {
		if r.Engine != engine || r.Config == "capacity" {
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
func (ev *Evaluation) plotTTFT(path string) (bool, error) {
	short, long := plot.New(), plot.New()
	short.Title.Text, long.Title.Text = "TTFT, short turns (aggregated, saturated)", "TTFT, long prefills (aggregated, saturated)"
	any := false
	for _, pl := range []*plot.Plot{short, long} {
		pl.X.Label.Text, pl.Y.Label.Text = "TTFT (ms, log scale)", "fraction of requests"
		pl.X.Scale, pl.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		pl.Y.Min, pl.Y.Max = 0, 1
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
	}
	for _, c := range allConfigs {
		r := ev.find(c, "aggregated", "saturated", "twin")
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
func (ev *Evaluation) plotTimeline(path string) (bool, error) {
	var panels []*plot.Plot
	yMax := 0.0
	for _, c := range []string{"A", "B"} {
		r := ev.find(c, "context", "saturated", "twin")
		if r == nil || len(r.busy) < 2 {
			continue
		}
		start := max(0, len(r.busy)/2-30)
		end := min(len(r.busy), start+60)
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s: per-rank busy time, forward iterations %d–%d (context servers, saturated)", c, start, end-1)
		pl.X.Label.Text, pl.Y.Label.Text = "forward iteration", "busy time (ms)"
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

// plotWaste: CDFs of the per-iteration lockstep waste per configuration,
// context servers beside aggregated serving (saturated load).
func (ev *Evaluation) plotWaste(path string) (bool, error) {
	var panels []*plot.Plot
	for _, w := range []string{"context", "aggregated"} {
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("per-iteration lockstep waste (%s, saturated)", w)
		pl.X.Label.Text, pl.Y.Label.Text = "waste: 1 − mean/max busy time over ranks", "fraction of forward iterations"
		pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = 0, 1, 0, 1
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
		n := 0
		for _, c := range allConfigs {
			r := ev.find(c, w, "saturated", "twin")
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
func (ev *Evaluation) plotBalance(path string) (bool, error) {
	pl := plot.New()
	pl.Title.Text = "token balance ratio over forward iterations (aggregated, saturated; moving mean of 100)"
	pl.X.Label.Text, pl.Y.Label.Text = "forward iteration", "mean/max of the ranks' tokens"
	pl.Y.Min, pl.Y.Max = 0, 1.3 // room for the legend
	pl.Add(plotter.NewGrid())
	pl.Legend.Top = true
	n := 0
	for _, c := range balanceConfigs {
		r := ev.find(c, "aggregated", "saturated", "twin")
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
