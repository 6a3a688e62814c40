// Package twin is the digital twin's engine: a pure-Go bridge.Engine whose
// device time comes from a cost model of one model on one GPU, so that the
// production scheduler, executor, router, KV pool and collectives can run a
// fleet of attention-DP ranks on one CPU with a virtual clock
// (DESIGN.md §3; docs/twin.md has every formula and every figure's source).
//
// A Profile holds everything the model uses — the GPU's datasheet figures,
// the model's shape, the parallel layout, every efficiency and overhead —
// each with its source, and reads and writes them as a versioned JSON file.
// Profile.StepCost models one rank's step; Profile.FleetStepMS combines the
// ranks' step costs into the iteration's lockstep duration (for MoE models
// the ranks meet at every MoE layer). A linear profile, fitted to a real
// engine's iteration logs with FitLinear, stands in for engines whose time
// is not a GPU roofline (the CPU engine).
//
// The package imports only the standard library, bridge and bridge's
// internal packages (the step contract and the in-flight queue it shares
// with the fake engine).
package twin
