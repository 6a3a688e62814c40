package fleet

import (
	"os"
	"strings"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/report"
)

// validateOutputs refuses an output file that is one of the run's inputs
// (the trace, the prompts, the checkpoint, the config or cost-profile file),
// or that another output also writes: opening it for writing would destroy
// the input, or the two writers would truncate each other, and either is
// found only after the run. The iteration log's and the profiles' paths are
// checked for rank 0 ("{rank}" replaced); "-" (standard output) is no file.
func (o *Options) validateOutputs() error {
	type file struct{ src, path string }
	var inputs []file
	for _, in := range []file{{o.Src("trace"), o.Trace}, {o.Src("prompts"), o.Text.File}, {o.Src("model"), o.Model},
		{"--config", o.ConfigPath}, {o.Src("cost-profile"), o.CostProfile}} {
		if st, err := os.Stat(in.path); in.path != "" && err == nil && st.Mode().IsRegular() {
			inputs = append(inputs, in) // a preset's name, or a directory, is no file to lose
		}
	}
	var outputs []file
	rank0 := func(path string) string { return strings.ReplaceAll(path, "{rank}", "0") }
	for _, out := range []file{{o.Src("cpuprofile"), rank0(o.CPUProfile)}, {o.Src("memprofile"), rank0(o.MemProfile)},
		{o.Src("iter-log"), rank0(o.IterLog)}, {o.Src("requests-out"), o.RequestsOut},
		{o.Src("kv-events"), o.KVEvents}} {
		if out.path != "" && out.path != "-" {
			outputs = append(outputs, out)
		}
	}
	for i, out := range outputs {
		for _, in := range inputs {
			if report.SameFile(out.path, in.path) {
				return usage.Errorf("%s %q is the file %s reads: writing it would destroy it", out.src, out.path, in.src)
			}
		}
		for _, other := range outputs[:i] {
			if report.SameFile(out.path, other.path) {
				return usage.Errorf("%s and %s both write %q", other.src, out.src, out.path)
			}
		}
	}
	return nil
}
