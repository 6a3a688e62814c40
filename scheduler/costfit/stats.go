package costfit

import (
	"math"
	"slices"
)

// The conventions of router-and-calibration.md §8.1, shared by the offline
// fit and the online calibrator. Every helper copies before sorting so that
// callers keep their slices in sample order.

// Median is the median of xs: the middle value of an odd count, the mean of
// the two middle values of an even count (§8.1). It is NaN for no values.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return medianSorted(s)
}

// medianSorted is Median of an already sorted slice.
func medianSorted(s []float64) float64 {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Percentile is the q-th percentile of xs under §8.1's convention: element
// min(n − 1, floor(n · q / 100)) of the sorted values (no interpolation). It is
// NaN for no values; q is expected in [0, 100].
func Percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentileSorted(s, q)
}

// percentileSorted is Percentile of an already sorted slice.
func percentileSorted(s []float64, q float64) float64 {
	i := int(math.Floor(float64(len(s)) * q / 100))
	return s[max(0, min(len(s)-1, i))]
}

// Round1000 rounds x to a multiple of 1 000 as §8.1 defines it:
// floor(x / 1 000 + 0.5) · 1 000 (halves round up, also for negatives).
func Round1000(x float64) int64 {
	return int64(math.Floor(x/1000+0.5)) * 1000
}

// roundInt rounds half up, the same convention at unit scale (the offset
// range and the raw threshold are printed this way).
func roundInt(x float64) int64 { return int64(math.Floor(x + 0.5)) }

// theilSen is the slope estimate of §8.2 step 4 over one run of samples in
// iteration order: the median of (y_j − y_i) / (x_j − x_i) over the pairs with
// j ≥ i + 3 and x_j > x_i. ok is false when no pair qualifies.
func theilSen(xs, ys []float64) (slope float64, ok bool) {
	var slopes []float64
	for i := range xs {
		for j := i + 3; j < len(xs); j++ {
			if xs[j] > xs[i] {
				slopes = append(slopes, (ys[j]-ys[i])/(xs[j]-xs[i]))
			}
		}
	}
	if len(slopes) == 0 {
		return 0, false
	}
	return Median(slopes), true
}
