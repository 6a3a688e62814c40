package fleet

import (
	"fmt"
	"slices"

	"github.com/lockstep-ai/lockstep/internal/usage"

	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
)

// moe reports whether the run's model is a mixture of experts.
func (o *Options) moe() bool {
	s, err := o.ModelShape()
	return err == nil && s.MoE()
}

// expertParallel reports whether the run deals a MoE model's experts over
// its attention-DP ranks: a native engine (CPU, or CUDA over NCCL) with more
// than one rank. Helix CP ranks hold every expert instead.
func (o *Options) expertParallel(world int) bool {
	return o.moe() && (o.Engine == "cpu" || o.Engine == "cuda") && o.CP == 1 && world > 1
}

// ncclUsable is nil when the engine library can open NCCL communicators
// (the CUDA engine's expert parallelism runs over them), else why not: a
// library built without NCCL, or without the native engine at all.
var ncclUsable = func() error {
	_, err := nativeengine.NCCLUniqueID()
	return err
}

// cudaBuilt reports whether the linked engine library has the CUDA backend.
var cudaBuilt = func() bool { return slices.Contains(nativeengine.SupportedBackends(), "cuda") }

// checkCUDA refuses --engine cuda with a library built without it, before
// any check that would blame something the user cannot fix that way.
func (o *Options) checkCUDA() error {
	if o.Engine != "cuda" || cudaBuilt() {
		return nil
	}
	return usage.Errorf("%s cuda: this engine library was built without the CUDA backend (build it with "+
		"-DENGINE_CUDA=ON, as scripts/ci-cuda-compile.sh does; docs/cuda.md); use --engine cpu or --engine twin",
		o.Src("engine"))
}

// checkMoE refuses MoE configurations no engine can run, and a moe-stop
// fault that could never fire, before any work (docs/moe.md).
func (o *Options) checkMoE(world int) error {
	if o.expertParallel(world) && o.Engine == "cuda" {
		if err := ncclUsable(); err != nil {
			return usage.Errorf("%s %s is a mixture-of-experts model on %d ranks: the cuda engine's expert parallelism "+
				"runs over NCCL, which this engine library cannot open (%v); "+
				"run it on one rank, or use --engine cpu or --engine twin", o.Src("model"), o.Model,
				world, err)
		}
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
