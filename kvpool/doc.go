// Package kvpool is the per-rank KV cache manager (shared/spec/kvcache.md):
// it decides which page holds which tokens of which sequence. Page memory
// lives in the native engine; this package hands out page indices and keeps
// everything else:
//
//   - the page pool of each tier (GPU, optional host) with per-page lock
//     (active sequences) and hold (suspended sequences) counts;
//   - per-sequence caches (committed ≤ history ≤ capacity) with the
//     SUSPENDED ⇄ ACTIVE → CLOSED status machine and page-table rows;
//   - radix-tree prefix reuse: SHA-256 hash-chain block keys, match,
//     commit, rebase, LRU eviction of cached blocks, reuse policies and
//     PER_CONVERSATION drop plans;
//   - the host tier: migration of suspended sequences' pages under GPU
//     pressure and their return on resume, handed back as page copies
//     (TakeCopies) for the executor to submit;
//   - KV cache events with the buffering and coalescing rules
//     (FlushIterationEvents, EventPublisher);
//   - GUARANTEED_NO_EVICT reservations and the Helix ledger (global-token
//     bookkeeping with ledger block P·cp, per-rank fields, decode counter);
//   - pure helpers for the executor's quota arithmetic and init vote.
//
// The package is a deterministic state machine: no I/O, no clock, no
// randomness, no goroutines, no locking, and map iteration never decides
// anything (ties break by page index, request id or insertion order). The
// same sequence of calls yields the same page indices, keys and events on
// every rank and in every run. A Manager is not safe for concurrent use;
// the rank's scheduling goroutine owns it. See docs/kvpool.md.
package kvpool
