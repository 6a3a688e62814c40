package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Arrival processes (`--arrivals`): how a replay times its requests.
const (
	// ArrivalsTrace keeps the trace's own times (× the arrival scale),
	// bursts included: the Mooncake traces log many requests at one
	// millisecond.
	ArrivalsTrace = "trace"
	// ArrivalsPoisson replaces them with a Poisson process at the replay's
	// mean rate: the same requests in the same order over about the same
	// span, with exponential gaps and no two at once (vLLM's
	// benchmark_serving --request-rate, burstiness 1).
	ArrivalsPoisson = "poisson"
)

// CheckArrivals validates an arrival process; source names the setting.
func CheckArrivals(process, source string) error {
	if process != ArrivalsTrace && process != ArrivalsPoisson {
		return fmt.Errorf("%s must be %s or %s, got %q", source, ArrivalsTrace, ArrivalsPoisson, process)
	}
	return nil
}

// PoissonArrivals re-times reqs, in place, as a Poisson process with the
// mean rate of their own arrivals: (n − 1) / (last − first). The order of
// arrival is kept (ties in the trace's order), so every conversation's turns
// still come one after another; the first request keeps its time, and the
// gaps are exponential with the mean gap, drawn from seed (the same seed,
// the same times). Requests that all arrive at once (arrival scale 0), or
// fewer than two, are left as they are. The times stay within MaxReplay.
func PoissonArrivals(reqs []Request, seed uint64) {
	if len(reqs) < 2 {
		return
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival) })
	first, last := reqs[order[0]].Arrival, reqs[order[len(order)-1]].Arrival
	if last <= first {
		return
	}
	mean := float64(last-first) / float64(len(reqs)-1)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	t := float64(first)
	for k, i := range order {
		if k > 0 {
			t += rng.ExpFloat64() * mean
		}
		reqs[i].Arrival = time.Duration(math.Min(t, float64(MaxReplay)))
	}
}
