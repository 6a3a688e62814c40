// Package racetest tells tests whether the race detector is on, so that
// whole-run end-to-end tests stay out of the race pass (make test-race) and
// property tests there use smaller inputs. The race pass is for the
// concurrent packages' synchronisation, which small inputs exercise as well
// as large ones; the detector slows a long single-goroutine run ten-fold
// without finding more.
package racetest

// Enabled reports whether this test binary was built with -race.
const Enabled = enabled

// Size returns full, or small when the race detector is on.
func Size(full, small int) int {
	if Enabled {
		return small
	}
	return full
}
