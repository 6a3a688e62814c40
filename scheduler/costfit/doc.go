// Package costfit calibrates the context-cost model behind equal-cost
// chunking (router-and-calibration.md §7–§10): the per-token offset O
// (kv_cost_offset) and the depth threshold D (kv_depth_threshold) that the
// scheduler's cost budget B = (O + D) · M + R · D is built from.
//
// Two calibrators live here:
//
//   - Fit, the offline fit of §8: a deterministic function of the per-rank
//     iteration-log records (executor.md §13) that finds "monopoly spans"
//     (one deep context request on one rank dominating the lockstep time),
//     fits a Theil–Sen line through them and prints the §8.3 report
//     (Result.Format). `worker calibrate` maps the JSON Lines into Record.
//   - Calibrator, the online calibrator of §9 with the lockstep correction of
//     §10: fed once per iteration, it refits every refresh_interval
//     observations and publishes (O, D, B) for Scheduler.PublishCost.
//
// Like the scheduler, the package is pure (DESIGN.md §1): standard library
// only, no clock (every time arrives as data, in milliseconds), no I/O beyond
// writing a report to a caller's io.Writer, no randomness, no goroutines. The
// same inputs give bit-identical results, which is what lets every
// attention-DP rank publish the same budget at the same iteration.
package costfit
