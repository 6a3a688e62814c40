// Package goengine is what the pure-Go engines (bridge/fake, bridge/twin)
// share beyond the step contract (bridge.StepChecker): the bookkeeping of
// submitted steps for an engine that computes at Submit, copying results
// into a caller's reused StepResult, their hash mixer and their sampling
// loop (Sample). It is internal to bridge so that the engines can share it
// without widening bridge's API; it imports only the standard library and
// bridge (tests/deps_test.go).
package goengine
