package fleet

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/internal/usage"

	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
)

// moe reports whether the run's model is a mixture of experts.
func (o *Options) moe() bool {
	s, err := o.ModelShape()
	return err == nil && s.MoE()
}

// expertParallel reports whether the run deals a MoE model's experts over
// its attention-DP ranks: the native CPU engine (the one with MoE exchanges)
// with more than one rank. Helix CP ranks hold every expert instead.
func (o *Options) expertParallel(world int) bool {
	return o.moe() && o.Engine == "cpu" && o.CP == 1 && world > 1
}

// checkMoE refuses MoE configurations no engine can run, and a moe-stop
// fault that could never fire, before any work (docs/moe.md).
func (o *Options) checkMoE(world int) error {
	if o.moe() && o.Engine == "cuda" && world > 1 {
		return usage.Errorf("%s %s is a mixture-of-experts model on %d ranks: the cuda engine has no expert parallelism "+
			"over NCCL yet (one CUDA engine holds every expert); run it on one rank, or use --engine cpu or --engine twin",
			o.Src("model"), o.Model, world)
	}
	f := o.fault
	if f == nil || f.kind != "moe-stop" {
		return nil
	}
	s, _ := o.ModelShape() // a MoE model, so it has a shape
	switch {
	case !o.expertParallel(world):
		return fmt.Errorf("%s=%q: moe-stop stops a rank inside a MoE exchange, which needs a MoE model (e.g. --model moe-tiny) "+
			"on --engine cpu with more than one attention-DP rank; nothing would wait for it here", FaultEnv, f.spec)
	case f.layer >= s.NumLayers:
		return fmt.Errorf("%s=%q: layer %d is outside the model's %d layers (0–%d); the fault would never fire",
			FaultEnv, f.spec, f.layer, s.NumLayers, s.NumLayers-1)
	}
	return nil
}

// openEPGroup opens the expert-parallel group of an in-process run with
// world ranks; nil when the run has no expert parallelism (a process of a
// multi-process run opens its member with openProcessExchangeGroup).
func (o *Options) openEPGroup(world int) (*nativeengine.CPGroup, error) {
	if !o.expertParallel(world) {
		return nil, nil
	}
	g, err := nativeengine.NewCPGroup(world, o.CollectiveTimeout)
	if err != nil {
		return nil, fmt.Errorf("opening the expert-parallel group: %w", err)
	}
	return g, nil
}
