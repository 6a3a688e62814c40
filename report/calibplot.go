package report

// The calibration plot of `worker calibrate --plot FILE.png`: the evidence
// behind the two numbers, side by side. Left, the monopoly samples the slope
// and intercept come from, with the fitted line and the recommended
// threshold; right, the token-weighted depth distribution the threshold is a
// percentile of.

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// Size of the calibration PNG in pixels (two panels side by side).
const (
	calPlotWidthPx  = 1600
	calPlotHeightPx = 640
	// calLegendSpans bounds the spans named in the legend; the others are
	// still drawn (colours repeat) and counted in one extra entry.
	calLegendSpans = 8
	// calHistBins is about how many bars the depth histogram has; bar
	// widths are whole multiples of the online calibrator's 16 384 buckets.
	calHistBins = 48
)

var (
	fitColour       = color.RGBA{R: 20, G: 20, B: 20, A: 255}
	thresholdColour = color.RGBA{R: 200, G: 30, B: 30, A: 255}
	histColour      = color.RGBA{R: 70, G: 130, B: 180, A: 255}
)

// WriteCalibrationPlot draws r's calibration plot into a PNG file at path.
func WriteCalibrationPlot(path string, r *costfit.Result) error {
	left, err := monopolyPanel(r)
	if err != nil {
		return err
	}
	right, err := depthPanel(r)
	if err != nil {
		return err
	}
	return SavePlots(path, calPlotWidthPx, calPlotHeightPx, left, right)
}

// monopolyPanel: KV depth vs lockstep iteration time, one colour per span,
// the fitted line T = A + slope·kv and a vertical line at D.
func monopolyPanel(r *costfit.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Monopoly samples and fit (N = %d): T = %.1f ms + %.3f µs × depth",
		r.Options.MaxNumTokens, r.InterceptMS, 1000*r.SlopeMS)
	p.X.Label.Text = "KV depth at chunk start (tokens)"
	p.Y.Label.Text = "iteration time T (ms, median over ranks)"
	p.X.Tick.Marker = kiloTicks{}
	p.Y.Tick.Marker = kiloTicks{plain: true}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())

	bySpan := make([]plotter.XYs, len(r.Spans))
	maxKV, maxT := float64(r.Threshold), r.InterceptMS
	for _, s := range r.Samples {
		bySpan[s.Span] = append(bySpan[s.Span], plotter.XY{X: float64(s.KV), Y: s.TMS})
		maxKV, maxT = max(maxKV, float64(s.KV)), max(maxT, s.TMS)
	}
	for i, xys := range bySpan {
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Color = SpanColours[i%len(SpanColours)]
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		sc.GlyphStyle.Radius = vg.Points(2.5)
		p.Add(sc)
		if i < calLegendSpans {
			sp := r.Spans[i]
			p.Legend.Add(fmt.Sprintf("span %d: rank %d, iterations %d–%d", i, sp.Rank, sp.FirstIter, sp.LastIter), sc)
		}
	}
	if n := len(r.Spans) - calLegendSpans; n > 0 {
		p.Legend.Add(fmt.Sprintf("… and %d more spans", n))
	}

	xEnd := maxKV * 1.05
	fit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: r.InterceptMS}, {X: xEnd, Y: r.InterceptMS + r.SlopeMS*xEnd}})
	if err != nil {
		return nil, err
	}
	fit.Color, fit.Width = fitColour, vg.Points(1.5)
	p.Add(fit)
	p.Legend.Add(fmt.Sprintf("fit (A = %.1f ms, slope %.3f µs per KV token)", r.InterceptMS, 1000*r.SlopeMS), fit)

	dataTop := max(maxT, r.InterceptMS+r.SlopeMS*xEnd) * 1.03
	if err := addThreshold(p, r, dataTop); err != nil {
		return nil, err
	}
	entries := min(len(r.Spans), calLegendSpans+1) + 2 // spans (or "… more"), fit, threshold
	p.X.Min, p.Y.Min, p.Y.Max = 0, 0, withLegendRoom(dataTop, entries)
	return p, nil
}

// depthPanel: the distribution of each record's midpoint depth
// (cost_s / ctx_tokens), weighted by its context tokens, with D marked.
func depthPanel(r *costfit.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Token-weighted midpoint depth (%d records, iterations ≥ %d)", len(r.Depths), r.Options.WarmupIters)
	p.X.Label.Text = "midpoint depth cost_s / ctx_tokens (KV tokens)"
	p.Y.Label.Text = "share of context tokens (%)"
	p.X.Tick.Marker = kiloTicks{}
	p.Y.Tick.Marker = kiloTicks{plain: true}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())

	var maxDepth float64
	var total int64
	for _, d := range r.Depths {
		maxDepth = max(maxDepth, d.Depth)
		total += d.Tokens
	}
	maxDepth = max(maxDepth, float64(r.Threshold))
	width := costfit.BucketTokens * math.Max(1, math.Ceil(maxDepth/costfit.BucketTokens/calHistBins))
	bins := make([]plotter.HistogramBin, int(maxDepth/width)+1)
	for i := range bins {
		bins[i].Min, bins[i].Max = float64(i)*width, float64(i+1)*width
	}
	for _, d := range r.Depths {
		bins[int(d.Depth/width)].Weight += 100 * float64(d.Tokens) / float64(total)
	}
	var top float64
	for _, b := range bins {
		top = max(top, b.Weight)
	}
	h := &plotter.Histogram{Bins: bins, FillColor: histColour, LineStyle: plotter.DefaultLineStyle}
	h.LineStyle.Color = color.White
	p.Add(h)
	p.Legend.Add(fmt.Sprintf("context tokens per bin of %.0f KV tokens", width), h)

	dataTop := top * 1.05
	if err := addThreshold(p, r, dataTop); err != nil {
		return nil, err
	}
	p.X.Min, p.Y.Min, p.Y.Max = 0, 0, withLegendRoom(dataTop, 2)
	return p, nil
}

// withLegendRoom extends a y range that ends at dataTop so that the legend,
// drawn at the top of the panel, sits above the data instead of over it.
func withLegendRoom(dataTop float64, entries int) float64 {
	const entryPt, areaPt = 15.0, 420.0 // a legend row and the data area, about
	frac := math.Min(0.6, float64(entries)*entryPt/areaPt+0.03)
	return dataTop / (1 - frac)
}

// addThreshold draws the recommended D as a dashed vertical line up to yTop.
func addThreshold(p *plot.Plot, r *costfit.Result, yTop float64) error {
	d := float64(r.Threshold)
	l, err := plotter.NewLine(plotter.XYs{{X: d, Y: 0}, {X: d, Y: yTop}})
	if err != nil {
		return err
	}
	l.Color, l.Width, l.Dashes = thresholdColour, vg.Points(1.5), []vg.Length{vg.Points(6), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(fmt.Sprintf("kv_depth_threshold D = %d (p%v of records)", r.Threshold, r.Options.Percentile), l)
	return nil
}

// kiloTicks labels a token axis in thousands ("400k", "1.2M"): plain
// integers of six or seven digits are hard to read at a glance. With plain
// it only drops the default's trailing zeros ("7500", not "7500.00").
type kiloTicks struct{ plain bool }

// Ticks implements plot.Ticker.
func (k kiloTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		if k.plain {
			ts[i].Label = fmt.Sprintf("%.6g", ts[i].Value)
		} else {
			ts[i].Label = kiloLabel(ts[i].Value)
		}
	}
	return ts
}

// kiloLabel formats a token count with a k or M suffix.
func kiloLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.6gM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.6gk", v/1e3)
	}
	return fmt.Sprintf("%.6g", v)
}
