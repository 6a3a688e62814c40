package serve

import (
	"math/rand/v2"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
)

// setSampling puts the request's sampling settings on its arrival. Greedy
// (temperature 0) unless asked; a sampled request without a seed gets a
// random one, so its tokens still depend only on (seed, content): identical
// on every rank count, batch and preemption (docs/sampling.md). The
// penalties apply to greedy requests too (min_p only to sampled ones, as
// in vLLM: it cannot change an argmax).
func setSampling(a *executor.Arrival, p genParams) *apiError {
	s := bridge.SamplingParams{PresencePenalty: float32(p.PresencePenalty), FrequencyPenalty: float32(p.FrequencyPenalty),
		RepetitionPenalty: float32(p.RepetitionPenalty)}
	if s.RepetitionPenalty == 1 {
		s.RepetitionPenalty = 0 // off either way; 0 keeps the arrival's zero value
	}
	if p.Temperature != 0 {
		seed := p.Seed
		if !p.HasSeed {
			seed = rand.Uint64()
		}
		s.Temperature, s.TopK, s.TopP, s.Seed = float32(p.Temperature), p.TopK, float32(p.TopP), seed
		s.MinP = float32(p.MinP)
	}
	a.Sampling = s
	if err := a.Sampling.Validate(); err != nil {
		return badRequest("temperature", "sampling parameters: %v", err)
	}
	return nil
}
