package serve

import (
	"math/rand/v2"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
)

// setSampling puts the request's sampling settings on its arrival. Greedy
// (temperature 0) unless asked; a sampled request without a seed gets a
// random one, so its tokens still depend only on (seed, content): identical
// on every rank count, batch and preemption (docs/sampling.md).
func setSampling(a *executor.Arrival, p genParams) *apiError {
	if p.Temperature == 0 {
		return nil
	}
	seed := p.Seed
	if !p.HasSeed {
		seed = rand.Uint64()
	}
	a.Sampling = bridge.SamplingParams{Temperature: float32(p.Temperature), TopK: p.TopK, TopP: float32(p.TopP), Seed: seed}
	if err := a.Sampling.Validate(); err != nil {
		return badRequest("temperature", "sampling parameters: %v", err)
	}
	return nil
}
