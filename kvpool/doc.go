// Package kvpool is the per-rank KV cache manager (shared/spec/kvcache.md): it
// decides which device page holds which tokens of which sequence. Page memory
// itself lives in the native engine; this package only hands out page indices
// and keeps the per-sequence lengths, statuses and GUARANTEED_NO_EVICT
// reservations.
//
// The package is a deterministic state machine: no I/O, no clock, no
// randomness, no goroutines, no locking. The same sequence of calls yields the
// same page indices on every rank, which is what lets ranks agree on block
// tables without exchanging them. A Manager is not safe for concurrent use;
// the rank's scheduling goroutine owns it.
//
// This first cut has one tier (device), no radix prefix reuse, no KV events
// and no Helix ledger. The data model is shaped for them: pages carry separate
// lock and hold counts (shared radix blocks will raise them above one), a
// sequence keeps committed ≤ history ≤ capacity, and the status machine
// (suspended ⇄ active → closed) is the one the host tier will hook into.
package kvpool
