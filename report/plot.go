package report

import (
	"image/color"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotDPI is the resolution of every PNG: sizes are given in pixels.
const plotDPI = 96

// SpanColours tell series apart (Tableau's ten); with more series they repeat.
var SpanColours = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}, {148, 103, 189, 255},
	{140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255},
}

// SavePlots lays plots out side by side in one row and writes a PNG of
// widthPx × heightPx pixels to path.
func SavePlots(path string, widthPx, heightPx int, plots ...*plot.Plot) error {
	pt := func(px int) vg.Length { return vg.Length(px) * vg.Inch / plotDPI }
	img := vgimg.NewWith(vgimg.UseWH(pt(widthPx), pt(heightPx)), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Centimeter, PadTop: vg.Millimeter * 4,
		PadBottom: vg.Millimeter * 4, PadLeft: vg.Millimeter * 4, PadRight: vg.Millimeter * 6}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, pl := range plots {
		pl.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// CDF returns the empirical CDF of v as points (x sorted, y in (0, 1]).
func CDF(v []float64) plotter.XYs {
	s := slices.Clone(v)
	slices.Sort(s)
	pts := make(plotter.XYs, len(s))
	for i, x := range s {
		pts[i] = plotter.XY{X: x, Y: float64(i+1) / float64(len(s))}
	}
	return pts
}
