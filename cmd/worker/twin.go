package main

// `worker twin-profile`: print the digital twin's cost profile of a GPU and
// model, or fit one to a real engine's iteration logs (docs/twin.md).

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge/twin"
	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/report"
)

// runTwinProfile is `worker twin-profile`.
func runTwinProfile(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("twin-profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gpu := fs.String("gpu", "h200", "GPU: "+strings.Join(twin.GPUNames(), ", "))
	model := fs.String("model", "llama-8b", "model: "+strings.Join(twin.ModelNames(), ", "))
	tp := fs.Int("tp", 1, "tensor-parallel GPUs per attention-DP rank")
	ranks := fs.Int("ranks", 1, "attention-DP ranks (expert parallelism of an MoE model spans them)")
	weight := fs.String("weight-dtype", "", "element type of the layers' weights: "+twin.DTypeNames+" (default: the model's own)")
	kv := fs.String("kv-dtype", "", "element type of the KV cache: "+twin.DTypeNames+" (default: the model's own)")
	gpn := fs.Int("gpus-per-node", 0, "GPUs per NVLink domain (0: the GPU's, 8 on HGX, 72 on GB300 NVL72)")
	zipf := fs.Float64("expert-zipf", -1, "Zipf exponent of routed-expert popularity of an MoE model (0: uniform; negative: the profile's)")
	measured := fs.String("measured", "", "re-base the built-in profile on a GPU's measured rates (the measured.json "+
		"scripts/device-check.sh writes: achieved GEMM and attention rates, decode bandwidth, step overhead)")
	fit := fs.Bool("fit", false, "fit a linear profile of the engine that wrote the iteration logs given as arguments "+
		"(files, or one path with {rank}); --model names the model they ran")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: worker twin-profile [--gpu G] [--model M] [--tp N] [--ranks R] [--weight-dtype D] [--kv-dtype D]\n"+
			"                           [--gpus-per-node N] [--expert-zipf S] [--measured FILE]\n"+
			"       worker twin-profile --fit [--model M] ITER_LOG...\n\n"+
			"Prints a cost profile of the digital twin as JSON (docs/twin.md).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if !*fit {
		if fs.NArg() > 0 {
			return usage.Errorf("unexpected arguments %v (iteration logs go with --fit)", fs.Args())
		}
		p, err := twin.BuiltinProfile(*gpu, *model, twin.Parallelism{TP: *tp})
		if err != nil {
			return usage.Wrap(err)
		}
		flagName := func(f string) string { return "--" + f }
		if p, err = fleet.ApplyTwinDeployment(p, *weight, *kv, *gpn, *zipf, flagName); err != nil {
			return err
		}
		if p, err = p.WithRanks(*ranks); err != nil {
			return usage.Wrap(err)
		}
		if *measured != "" {
			m, err := twin.LoadMeasurements(*measured)
			if err != nil {
				return usage.Errorf("--measured: %v", err)
			}
			if p, err = twin.ProfileFromMeasurements(p, m); err != nil {
				return usage.Errorf("--measured %s: %v", *measured, err)
			}
		}
		return p.WriteJSON(stdout)
	}
	if fs.NArg() == 0 {
		return usage.Errorf("--fit needs the iteration logs of a run (e.g. 'DIR/iter.{rank}.jsonl')")
	}
	files, err := report.ExpandLogPaths(fs.Args())
	if err != nil {
		return usage.Wrap(err)
	}
	m, err := twin.BuiltinModel(*model)
	if err != nil {
		return usage.Wrap(err)
	}
	p, st, err := fleet.FitTwinProfile(files, m)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "fit: %d steps from %d files; per-step error: mean %.1f%%, p90 %.1f%%; host %.3f ms per iteration\n",
		st.Samples, len(files), 100*st.MeanAbsErr, 100*st.P90AbsErr, p.HostOverheadMS.Value)
	return p.WriteJSON(stdout)
}
