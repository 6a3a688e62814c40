package main

// `worker twin-validate`: run the digital twin on the published GPU figures
// kept in eval/twinval/published and print twin/published per row with the
// mean absolute error per group (docs/twin.md, "Validation").

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lockstep-ai/lockstep/eval/twinval"
	"github.com/lockstep-ai/lockstep/internal/usage"
)

// runTwinValidate is `worker twin-validate`.
func runTwinValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("twin-validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	only := fs.String("only", "all", "tables to run: all, or a comma list of operators, latency, throughput")
	fit := fs.Bool("fit", false, "print the fits of the twin's fitted coefficients to the operator tables instead "+
		"(fitted value, built-in value, grid, error)")
	markdown := fs.Bool("markdown", false, "print the rows as Markdown tables (docs/twin.md publishes them)")
	check := fs.Bool("check", false, "exit with status 1 when a group misses its target")
	sources := fs.Bool("sources", false, "print each published table's source, version and configuration, then exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: worker twin-validate [--only operators,latency,throughput] [--markdown] [--check]\n"+
			"       worker twin-validate --fit | --sources\n\n"+
			"Runs the twin on published GPU figures (TensorRT-LLM v1.0 throughput, single-stream latencies, Vidur's\n"+
			"H100 operator profiles, DeepGEMM's FP8 GEMMs, B200 NVFP4 GEMMs) and prints twin/published per row (docs/twin.md).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return usage.Errorf("unexpected arguments %v", fs.Args())
	}
	if *sources {
		src, err := twinval.Sources()
		if err != nil {
			return err
		}
		for name, lines := range src {
			fmt.Fprintf(stdout, "%s\n  %s\n", name, strings.Join(lines, "\n  "))
		}
		return nil
	}
	if *fit {
		fits, err := twinval.FitAll()
		if err != nil {
			return err
		}
		twinval.WriteFits(stdout, fits)
		return nil
	}
	opt, err := parseOnly(*only)
	if err != nil {
		return err
	}
	opt.Log = stderr
	rs, err := twinval.Validate(opt)
	if err != nil {
		return err
	}
	if *markdown {
		twinval.WriteMarkdown(stdout, rs)
	} else {
		twinval.WriteTable(stdout, rs)
	}
	if *check {
		for _, s := range twinval.Summarize(rs) {
			if !s.Met() {
				return fmt.Errorf("%s: %d of %d rows outside ±%g%%", s.Name, s.Rows-s.Within, s.Rows, 100*s.Target)
			}
		}
	}
	return nil
}

// parseOnly reads --only.
func parseOnly(s string) (twinval.Options, error) {
	if s == "all" {
		return twinval.All, nil
	}
	var o twinval.Options
	for _, part := range strings.Split(s, ",") {
		switch strings.TrimSpace(part) {
		case "operators":
			o.Operators = true
		case "latency":
			o.Latency = true
		case "throughput":
			o.Throughput = true
		default:
			return o, usage.Errorf("--only %q: unknown table %q (allowed: all, or a comma list of operators, latency, throughput)", s, part)
		}
	}
	return o, nil
}
