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

// choiceParams are the settings of choice j (of n) of a prompt. With a
// seed, choice 0 keeps it (n = 1 is unchanged) and choice j > 0 samples
// with a seed derived from (seed, j), so the choices differ, the same on
// every run; without one every choice draws its own random seed
// (setSampling). Greedy choices are all the same (as in vLLM).
func choiceParams(p genParams, j int) genParams {
	if j > 0 && p.HasSeed {
		p.Seed = choiceSeed(p.Seed, j)
	}
	return p
}

// choiceSeed is splitmix64's output for seed + j·golden: distinct seeds
// for the choices of one request seed, well mixed.
func choiceSeed(seed uint64, j int) uint64 {
	z := seed + uint64(j)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
