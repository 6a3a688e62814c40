package eval

import (
	"fmt"
	"image/color"
	"slices"

	"github.com/lockstep-ai/lockstep/report"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The load sweep's figures: goodput, the knee, and the plots of latency
// and goodput against the offered request rate.

// kneeShare is the share of the offered rate the goodput must keep for a
// sweep point to be below the knee.
const kneeShare = 0.9

// knee is one configuration's knee on one workload: the highest swept
// rate whose goodput is at least 90 % of the offered rate.
type knee struct {
	Config   string  `json:"config"`
	Workload string  `json:"workload"`
	Points   int     `json:"points"` // the sweep points run
	LoadX    float64 `json:"load_x"` // 0: no point met it
	RPS      float64 `json:"offered_requests_per_s"`
	Goodput  float64 `json:"goodput_requests_per_s"`
	// Below is whether every lower point met it too (a knee with a failing
	// point beneath it is noisy and says so in the report).
	Below bool `json:"monotone"`
}

// meets is whether run r keeps its goodput within kneeShare of the offer.
func meets(r *evalRun) bool { return r.OfferedRPS > 0 && r.GoodputRPS >= kneeShare*r.OfferedRPS }

// sweepRuns are a configuration's sweep runs on one workload, by load.
func (ev *Evaluation) sweepRuns(model, config, workload string) []*evalRun {
	var out []*evalRun
	for _, r := range ev.runs {
		if r.Model == model && r.Config == config && r.Workload == workload && r.LoadX > 0 && r.Engine == "twin" {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *evalRun) int {
		switch {
		case a.LoadX < b.LoadX:
			return -1
		case a.LoadX > b.LoadX:
			return 1
		}
		return 0
	})
	return out
}

// kneeOf is the knee of a configuration's sweep on one workload.
func kneeOf(config, workload string, runs []*evalRun) knee {
	k := knee{Config: config, Workload: workload, Points: len(runs), Below: true}
	for _, r := range runs {
		if meets(r) {
			k.LoadX, k.RPS, k.Goodput = r.LoadX, r.OfferedRPS, r.GoodputRPS
		}
	}
	for _, r := range runs {
		if r.LoadX < k.LoadX && !meets(r) {
			k.Below = false
		}
	}
	return k
}

// knees are the knees of every configuration swept at more than one point.
func (ev *Evaluation) knees(model string) []knee {
	var out []knee
	for _, w := range []string{"context", "aggregated"} {
		for _, c := range allConfigs {
			if runs := ev.sweepRuns(model, c, w); len(runs) > 1 {
				out = append(out, kneeOf(c, w, runs))
			}
		}
	}
	return out
}

// plotGoodput: goodput against the offered request rate, one line per
// configuration, context servers beside aggregated serving, with the
// offered rate and 90 % of it as dashed guides.
func (ev *Evaluation) plotGoodput(model, path string) (bool, error) {
	var panels []*plot.Plot
	for _, w := range []string{"context", "aggregated"} {
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s, %s: goodput (SLO TTFT ≤ %v, TPOT ≤ %v)", model, w, ev.opt.SLOTTFT, ev.opt.SLOTPOT)
		pl.X.Label.Text, pl.Y.Label.Text = "offered rate (requests/s)", "goodput (requests/s within the SLO)"
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
		maxX, n := 0.0, 0
		for _, c := range allConfigs {
			runs := ev.sweepRuns(model, c, w)
			if len(runs) < 2 {
				continue
			}
			pts := make(plotter.XYs, len(runs))
			for i, r := range runs {
				pts[i] = plotter.XY{X: r.OfferedRPS, Y: r.GoodputRPS}
				maxX = max(maxX, r.OfferedRPS)
			}
			if err := addLine(pl, pts, c, c); err != nil {
				return false, err
			}
			n++
		}
		if n == 0 {
			continue
		}
		for _, g := range []struct {
			share float64
			name  string
		}{{1, "offered"}, {kneeShare, "90 % of offered (the knee)"}} {
			l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: maxX, Y: g.share * maxX}})
			if err != nil {
				return false, err
			}
			l.Color, l.Dashes = color.RGBA{A: 255}, []vg.Length{vg.Points(4), vg.Points(3)}
			if g.share != 1 {
				l.Color = color.RGBA{R: 128, G: 128, B: 128, A: 255}
			}
			pl.Add(l)
			pl.Legend.Add(g.name, l)
		}
		pl.X.Min, pl.Y.Min = 0, 0
		panels = append(panels, pl)
	}
	if len(panels) == 0 {
		return false, nil
	}
	return true, report.SavePlots(path, 1600, 640, panels...)
}

// plotLatency: p90 TTFT against the offered request rate on both
// workloads, and p90 TPOT on aggregated serving (log scale), one line per
// configuration, the SLO as a dashed line.
func (ev *Evaluation) plotLatency(model, path string) (bool, error) {
	var panels []*plot.Plot
	for _, v := range []struct {
		workload, what string
		slo            float64
		get            func(*evalRun) float64
	}{
		{"context", "TTFT", float64(ev.opt.SLOTTFT) / 1e6, func(r *evalRun) float64 { return r.TTFT.P90 }},
		{"aggregated", "TTFT", float64(ev.opt.SLOTTFT) / 1e6, func(r *evalRun) float64 { return r.TTFT.P90 }},
		{"aggregated", "TPOT", float64(ev.opt.SLOTPOT) / 1e6, func(r *evalRun) float64 { return r.TPOT.P90 }},
	} {
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s, %s: p90 %s", model, v.workload, v.what)
		pl.X.Label.Text, pl.Y.Label.Text = "offered rate (requests/s)", fmt.Sprintf("p90 %s (ms, log scale)", v.what)
		pl.Y.Scale, pl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		pl.Add(plotter.NewGrid())
		pl.Legend.Top, pl.Legend.Left = true, true
		minX, maxX, n := 0.0, 0.0, 0
		for _, c := range allConfigs {
			runs := ev.sweepRuns(model, c, v.workload)
			if len(runs) < 2 {
				continue
			}
			pts := make(plotter.XYs, 0, len(runs))
			for _, r := range runs {
				if y := v.get(r); y > 0 {
					pts = append(pts, plotter.XY{X: r.OfferedRPS, Y: y})
					if minX == 0 || r.OfferedRPS < minX {
						minX = r.OfferedRPS
					}
					maxX = max(maxX, r.OfferedRPS)
				}
			}
			if len(pts) == 0 {
				continue
			}
			if err := addLine(pl, pts, c, c); err != nil {
				return false, err
			}
			n++
		}
		if n == 0 {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: minX, Y: v.slo}, {X: maxX, Y: v.slo}})
		if err != nil {
			return false, err
		}
		l.Color, l.Dashes = color.RGBA{A: 255}, []vg.Length{vg.Points(4), vg.Points(3)}
		pl.Add(l)
		pl.Legend.Add("SLO", l)
		panels = append(panels, pl)
	}
	if len(panels) == 0 {
		return false, nil
	}
	return true, report.SavePlots(path, 1800, 640, panels...)
}

// addLine draws one configuration's line with its points marked.
func addLine(pl *plot.Plot, pts plotter.XYs, config, label string) error {
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color, l.Width = configColours[config], vg.Points(2)
	s.Color = configColours[config]
	pl.Add(l, s)
	pl.Legend.Add(label, l, s)
	return nil
}
