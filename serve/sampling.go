package serve

import "github.com/lockstep-ai/lockstep/executor"

// setSampling puts the request's sampling settings on its arrival.
func setSampling(a *executor.Arrival, p genParams) *apiError {
	if p.Temperature > 0 {
		return badRequest("temperature", "sampling (temperature > 0) is not available in this build yet; use temperature 0")
	}
	return nil
}
