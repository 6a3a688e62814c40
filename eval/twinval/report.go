package twinval

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
)

// Summary is one group's accuracy.
type Summary struct {
	Group
	Rows    int
	MAE     float64 // mean |twin/published − 1|
	Worst   float64 // the largest |twin/published − 1|
	Within  int     // rows within the target (all rows when there is none)
	Missing []string
}

// Met reports whether every row is within the group's target (always for a
// group without one).
func (s Summary) Met() bool { return s.Target == 0 || s.Within == s.Rows }

// Summarize groups results in Groups order.
func Summarize(rs []Result) []Summary {
	var out []Summary
	for _, g := range Groups {
		s := Summary{Group: g}
		var sum float64
		for _, r := range rs {
			if r.Group != g.Name {
				continue
			}
			e := math.Abs(r.Ratio() - 1)
			s.Rows++
			sum += e
			s.Worst = math.Max(s.Worst, e)
			if g.Target == 0 || e <= g.Target {
				s.Within++
			} else {
				s.Missing = append(s.Missing, r.Config)
			}
		}
		if s.Rows == 0 {
			continue
		}
		s.MAE = sum / float64(s.Rows)
		out = append(out, s)
	}
	return out
}

// WriteTable prints every row (twin/published) by group, then the summary.
func WriteTable(w io.Writer, rs []Result) {
	for _, g := range Groups {
		var rows []Result
		for _, r := range rs {
			if r.Group == g.Name {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## %s  [%s]\n", g.Title, strings.Join(sourcesOf(rows), ", "))
		width := 0
		for _, r := range rows {
			width = max(width, len(r.Config))
		}
		fmt.Fprintf(w, "%-*s  %12s  %12s  %7s\n", width, "configuration", "published", "twin", "twin/pub")
		for _, r := range rows {
			flag := ""
			if g.Target > 0 && math.Abs(r.Ratio()-1) > g.Target {
				flag = "  <- outside ±" + pct(g.Target)
			}
			fmt.Fprintf(w, "%-*s  %12s  %12s  %7.3f%s\n", width, r.Config, num(r.Published), num(r.Twin), r.Ratio(), flag)
		}
	}
	WriteSummary(w, Summarize(rs))
}

// WriteSummary prints one line per group: rows, mean absolute error, worst
// row and the target.
func WriteSummary(w io.Writer, ss []Summary) {
	fmt.Fprintf(w, "\n## summary\n%-20s %5s %8s %8s  %s\n", "group", "rows", "MAE", "worst", "target")
	for _, s := range ss {
		target := "(reported)"
		if s.Target > 0 {
			verdict := "met"
			if !s.Met() {
				verdict = fmt.Sprintf("MISSED by %d: %s", s.Rows-s.Within, strings.Join(s.Missing, "; "))
			}
			target = fmt.Sprintf("±%s, %d/%d within: %s", pct(s.Target), s.Within, s.Rows, verdict)
		}
		fmt.Fprintf(w, "%-20s %5d %7.1f%% %7.1f%%  %s\n", s.Name, s.Rows, 100*s.MAE, 100*s.Worst, target)
	}
}

// WriteMarkdown prints the rows of the named groups as Markdown tables
// (docs/twin.md publishes them).
func WriteMarkdown(w io.Writer, rs []Result) {
	byGroup := map[string][]Result{}
	for _, r := range rs {
		byGroup[r.Group] = append(byGroup[r.Group], r)
	}
	names := make([]string, 0, len(byGroup))
	for n := range byGroup {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, g := range Groups {
		rows := byGroup[g.Name]
		if len(rows) == 0 {
			continue
		}
		files := sourcesOf(rows)
		for i, f := range files {
			files[i] = "`eval/twinval/published/" + f + "`"
		}
		fmt.Fprintf(w, "\n%s (%s):\n\n| configuration | published | twin | twin/published |\n|---|---|---|---|\n", g.Title, strings.Join(files, ", "))
		for _, r := range rows {
			fmt.Fprintf(w, "| %s | %s | %s | %.3f |\n", r.Config, num(r.Published), num(r.Twin), r.Ratio())
		}
	}
	fmt.Fprintln(w)
	ss := Summarize(rs)
	fmt.Fprintf(w, "| group | rows | mean abs. error | worst | within target |\n|---|---|---|---|---|\n")
	for _, s := range ss {
		target := "reported"
		if s.Target > 0 {
			target = fmt.Sprintf("%d/%d within ±%s", s.Within, s.Rows, pct(s.Target))
		}
		fmt.Fprintf(w, "| %s | %d | %.1f %% | %.1f %% | %s |\n", s.Name, s.Rows, 100*s.MAE, 100*s.Worst, target)
	}
}

func pct(f float64) string { return fmt.Sprintf("%g%%", 100*f) }

// num prints a figure with four significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.4g", v)
	default:
		return fmt.Sprintf("%.4f", v)
	}
}

// sourcesOf is the tables rows come from, in the order they first appear.
func sourcesOf(rows []Result) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Source) {
			out = append(out, r.Source)
		}
	}
	return out
}
