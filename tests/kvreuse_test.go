//go:build native

package tests

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/workload"
)

type reuseReport struct {
	report
	Prefix struct {
		HitRate      float64 `json:"hit_rate"`
		ReusedTokens int64   `json:"reused_tokens"`
		PromptTokens int64   `json:"prompt_tokens"`
		LiveBlocks   int64   `json:"live_blocks"`
	}
	EventsDropped int64 `json:"events_dropped"`
}

func serveReuse(t *testing.T, bin string, args ...string) reuseReport {
	t.Helper()
	out := serveRaw(t, bin, args...)
	var rep reuseReport
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	return rep
}

// expectedReusable is what the trace's hash_ids allow a single rank with a
// pool that holds everything and pages of the scaled block size: the longest
// chain of full blocks an earlier request had, then the part of the next
// block an earlier request held as its partial last block, never the last
// prompt token (scripts/expected-prefix-hit.py computes the same).
func expectedReusable(reqs []workload.Request) (prompt, reused int64) {
	seen := map[string]bool{}
	partial := map[string]int{}
	key := func(h []uint64) string { b, _ := json.Marshal(h); return string(b) }
	for _, r := range reqs {
		h, bt, n := r.HashIDs, r.BlockTokens, len(r.HashIDs)
		last := r.Len() - bt*(n-1)
		full := n - 1
		if last == bt {
			full = n
		}
		m := 0
		for m < full && seen[key(h[:m+1])] {
			m++
		}
		tokens := m * bt
		if m < n {
			own := bt
			if m == n-1 {
				own = last
			}
			tokens += min(partial[key(h[:m+1])], own)
		}
		prompt += int64(r.Len())
		reused += int64(min(tokens, r.Len()-1))
		for k := 1; k <= full; k++ {
			seen[key(h[:k])] = true
		}
		if full < n {
			partial[key(h)] = max(partial[key(h)], last)
		}
	}
	return prompt, reused
}

// TestPrefixReuseOnConversationTrace is issue 4's acceptance run: the hit
// rate matches what the hash_ids allow, outputs equal a run without reuse,
// and the event stream balances against the pools at the end.
func TestPrefixReuseOnConversationTrace(t *testing.T) {
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	reqs, err := workload.ReadFile(trace, workload.Options{Limit: 300, LengthScale: 0.02, VocabSize: 512, Seed: 1})
	require.NoError(t, err)
	wantPrompt, wantReused := expectedReusable(reqs)
	base := []string{"--engine", "cpu", "--trace", trace, "--limit", "300", "--length-scale", "0.02"}

	// One rank, a pool that holds everything, pages of the block size:
	// exactly what the trace allows.
	exact := serveReuse(t, bin, append(base, "--ranks", "1", "--pages", "20000", "--tokens-per-page", "10")...)
	require.Equal(t, wantPrompt, exact.Prefix.PromptTokens)
	require.Equal(t, wantReused, exact.Prefix.ReusedTokens)

	// The command: 4 ranks, events on; same digest with reuse off.
	events := filepath.Join(t.TempDir(), "events.jsonl")
	on := serveReuse(t, bin, append(base, "--ranks", "4", "--kv-events", events)...)
	off := serveReuse(t, bin, append(base, "--ranks", "4", "--no-prefix-reuse")...)
	require.Positive(t, on.Prefix.HitRate)
	require.LessOrEqual(t, on.Prefix.ReusedTokens, wantReused)
	require.Zero(t, off.Prefix.ReusedTokens)
	require.Equal(t, off.OutputDigest, on.OutputDigest, "prefix reuse must not change outputs")
	require.Equal(t, exact.OutputDigest, on.OutputDigest)
	require.Zero(t, on.EventsDropped)

	// Per rank: sequence numbers from 0 without gaps; stored − removed
	// blocks equals the blocks left in the pools.
	f, err := os.Open(events)
	require.NoError(t, err)
	defer f.Close()
	next := map[int]uint64{}
	var live int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev struct {
			Rank   int
			Seq    uint64
			Type   string
			Blocks []json.RawMessage
			Hashes []json.RawMessage
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		require.Equal(t, next[ev.Rank], ev.Seq, "rank %d sequence numbers must be contiguous", ev.Rank)
		next[ev.Rank]++
		switch ev.Type {
		case "stored":
			live += int64(len(ev.Blocks))
		case "removed":
			live -= int64(len(ev.Hashes))
		}
	}
	require.NoError(t, sc.Err())
	require.Len(t, next, 4, "every rank published")
	require.Equal(t, on.Prefix.LiveBlocks, live, "stored minus removed blocks must equal the blocks left in the pools")
}

// TestHostTierSuspension: a pool small enough to force suspension with a
// host tier: every request completes, suspensions are counted, outputs are
// unchanged — in both loops.
func TestHostTierSuspension(t *testing.T) {
	bin := worker(t)
	trace := sharedTrace(t, "conversation_trace.jsonl")
	base := []string{"--engine", "cpu", "--trace", trace, "--limit", "300", "--length-scale", "0.02", "--ranks", "2"}
	ref := serveReuse(t, bin, base...)
	for _, overlap := range []string{"on", "off"} {
		rep := serveReuse(t, bin, append(base, "--pages", "160", "--host-pages", "1024", "--overlap", overlap)...)
		require.Equal(t, 300, rep.Requests.Completed)
		require.Positive(t, rep.Preemptions.Suspended, "overlap %s", overlap)
		require.Equal(t, ref.OutputDigest, rep.OutputDigest, "overlap %s", overlap)
	}
}

// TestIdenticalPromptsFitAloneWorker is issue 9's defect 1 through the
// worker: two identical prompts (11 tokens after --length-scale 0.01, plus 3
// new tokens) on a pool of one 16-token page. Each fits the pool alone, so
// both complete with the digest of a roomy run without reuse, whatever the
// reuse setting, host tier, capacity policy and loop.
func TestIdenticalPromptsFitAloneWorker(t *testing.T) {
	bin := worker(t)
	trace := filepath.Join(t.TempDir(), "p1c.jsonl")
	line := `{"timestamp":0,"input_length":1100,"output_length":300,"hash_ids":[0,1,2]}` + "\n"
	require.NoError(t, os.WriteFile(trace, []byte(line+line), 0o644))
	base := []string{"--trace", trace, "--length-scale", "0.01", "--ranks", "1"}
	want := serve(t, bin, append(base, "--pages", "64", "--no-prefix-reuse")...)
	require.Equal(t, 2, want.Requests.Completed)
	for _, reuse := range []bool{true, false} {
		for _, host := range []string{"0", "4"} {
			for _, policy := range []string{"max_utilization", "guaranteed_no_evict"} {
				for _, overlap := range []string{"on", "off"} {
					args := append(append([]string{}, base...), "--pages", "1", "--host-pages", host,
						"--policy", policy, "--overlap", overlap)
					if !reuse {
						args = append(args, "--no-prefix-reuse")
					}
					got := serve(t, bin, args...)
					require.Equal(t, 2, got.Requests.Completed, "%v", args)
					require.Equal(t, want.OutputDigest, got.OutputDigest, "%v", args)
				}
			}
		}
	}
}
