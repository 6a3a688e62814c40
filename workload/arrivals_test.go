package workload

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bursty is n requests arriving in bursts of burst at once, a gap apart.
func bursty(n, burst int, gap time.Duration) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Index: i, Arrival: time.Duration(i/burst) * gap}
	}
	return reqs
}

// TestPoissonArrivals: the same requests in the same order over about the
// same span, at the same mean rate, without two at once; the same seed
// gives the same times, another seed other times.
func TestPoissonArrivals(t *testing.T) {
	const n = 4000
	reqs := bursty(n, 20, time.Second)
	span := reqs[n-1].Arrival - reqs[0].Arrival
	PoissonArrivals(reqs, 7)
	require.Equal(t, time.Duration(0), reqs[0].Arrival, "the first request keeps its time")
	distinct := map[time.Duration]bool{}
	var gaps []float64
	for i := 1; i < n; i++ {
		require.GreaterOrEqual(t, reqs[i].Arrival, reqs[i-1].Arrival, "the order of arrival is kept")
		distinct[reqs[i].Arrival] = true
		gaps = append(gaps, float64(reqs[i].Arrival-reqs[i-1].Arrival))
	}
	require.Greater(t, len(distinct), n-10, "no bursts: (nearly) every request at its own time")
	mean := float64(span) / float64(n-1)
	var sum, sq float64
	for _, g := range gaps {
		sum += g
		sq += g * g
	}
	m := sum / float64(len(gaps))
	sd := math.Sqrt(sq/float64(len(gaps)) - m*m)
	require.InEpsilon(t, mean, m, 0.05, "the mean gap is the trace's")
	require.InEpsilon(t, m, sd, 0.1, "exponential gaps: the standard deviation is the mean")

	again := bursty(n, 20, time.Second)
	PoissonArrivals(again, 7)
	other := bursty(n, 20, time.Second)
	PoissonArrivals(other, 8)
	times := func(rs []Request) []time.Duration {
		var ts []time.Duration
		for _, r := range rs {
			ts = append(ts, r.Arrival)
		}
		return ts
	}
	require.Equal(t, times(reqs), times(again))
	require.NotEqual(t, times(reqs), times(other))
}

// TestPoissonArrivalsKeepsTheOrderOfAnUnsortedTrace: requests listed out of
// arrival order keep their relative order of arrival (ties in list order).
func TestPoissonArrivalsKeepsTheOrderOfAnUnsortedTrace(t *testing.T) {
	at := []time.Duration{5 * time.Second, 0, 5 * time.Second, 2 * time.Second, 9 * time.Second}
	reqs := make([]Request, len(at))
	for i := range reqs {
		reqs[i] = Request{Index: i, Arrival: at[i]}
	}
	PoissonArrivals(reqs, 1)
	order := []int{0, 1, 2, 3, 4}
	slices.SortStableFunc(order, func(a, b int) int { return int(reqs[a].Arrival - reqs[b].Arrival) })
	require.Equal(t, []int{1, 3, 0, 2, 4}, order)
}

// TestPoissonArrivalsLeavesAllAtOnce: every request at once (arrival scale
// 0) and a single request are left as they are.
func TestPoissonArrivalsLeavesAllAtOnce(t *testing.T) {
	reqs := bursty(10, 10, time.Second)
	PoissonArrivals(reqs, 1)
	for _, r := range reqs {
		require.Zero(t, r.Arrival)
	}
	one := []Request{{Arrival: 3 * time.Second}}
	PoissonArrivals(one, 1)
	require.Equal(t, 3*time.Second, one[0].Arrival)
	PoissonArrivals(nil, 1)
}

func TestCheckArrivals(t *testing.T) {
	require.NoError(t, CheckArrivals("trace", "--arrivals"))
	require.NoError(t, CheckArrivals("poisson", "--arrivals"))
	err := CheckArrivals("gamma", "--arrivals")
	require.ErrorContains(t, err, `--arrivals must be trace or poisson, got "gamma"`)
}
