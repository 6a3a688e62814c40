package main

// `worker schedule --scenario FILE.json`: a dry run of the scheduler on one
// rank (docs/schedule-dry-run.md), run by scheduler/sim/scenario.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/scheduler/sim/scenario"
)

// runSchedule is the `schedule` subcommand.
func runSchedule(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("scenario", "", "scenario file (JSON; see docs/schedule-dry-run.md)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		return usage.Wrap(errors.New("--scenario FILE.json is required (and no other arguments)"))
	}
	raw, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("--scenario: %w", err)
	}
	sc, err := scenario.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	return scenario.Run(sc, stdout, stderr)
}
