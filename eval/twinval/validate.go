package twinval

import (
	"fmt"
	"io"
	"os"
)

// Options select what Validate runs.
type Options struct {
	// Operators runs the operator tables (milliseconds of CPU).
	Operators bool
	// Latency runs the single-stream rows (a fleet run each, fast).
	Latency bool
	// Throughput runs the TensorRT-LLM throughput rows (a fleet run of up to
	// 30 000 requests each: the whole table takes about a minute).
	Throughput bool
	// ThroughputRows, when set, runs only these rows (0-based, table order)
	// of the throughput table.
	ThroughputRows []int
	// Log receives the fleet runs' logs (nil: discarded).
	Log io.Writer
}

// All is every table.
var All = Options{Operators: true, Latency: true, Throughput: true}

// Validate runs the twin on the selected published tables with the
// built-in coefficients.
func Validate(opt Options) ([]Result, error) {
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	var out []Result
	if opt.Throughput || opt.Latency {
		dir, err := os.MkdirTemp("", "twin-validate-")
		if err != nil {
			return nil, fmt.Errorf("twin-validate: %w", err)
		}
		defer os.RemoveAll(dir)
		if opt.Throughput {
			rs, err := throughputRows(dir, opt.ThroughputRows, log)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
		}
		if opt.Latency {
			rs, err := latencyRows(dir, log)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
		}
	}
	if opt.Operators {
		rs, err := operatorRows(nil)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}
