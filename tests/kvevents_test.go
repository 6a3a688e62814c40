//go:build native

package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/model/modeltest"
)

// freePorts returns a port p with p and p+1 free (a rank-offset pair).
func freePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := ln.Addr().(*net.TCPAddr).Port
		ln2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// pyClients installs (or finds) the pinned Python clients; under CI
// (LOCKSTEP_REQUIRE_MODEL=1) they must be there, elsewhere the test skips.
func pyClients(t *testing.T) *exec.Cmd {
	t.Helper()
	out, err := exec.Command("../scripts/ensure-pyclient.sh").Output()
	if err != nil {
		msg := fmt.Sprintf("the Python clients (openai, msgspec, pyzmq) could not be installed: %v", err)
		if os.Getenv("LOCKSTEP_REQUIRE_MODEL") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	lines := strings.Fields(string(out))
	cmd := exec.Command(lines[0])
	if len(lines) > 1 {
		cmd.Env = append(os.Environ(), "PYTHONPATH="+lines[1])
	}
	return cmd
}

// storedEvent and the removed lists are one rank's stream, as both sides see it.
type storedEvent struct {
	Hashes []json.Number `json:"hashes"`
	Parent *json.Number  `json:"parent"`
	Tokens []int32       `json:"tokens"`
}

type rankStream struct {
	Stored  []storedEvent   `json:"stored"`
	Removed [][]json.Number `json:"removed"`
	Live    int             `json:"live"`
	Missed  int             `json:"missed"`
}

// jsonlStreams reads the pool's own record (--kv-events) into per-rank
// streams of stored and removed blocks, full blocks of blockSize tokens
// only (vLLM's BlockStored carries no partial block: the publisher leaves
// them and their removals out).
func jsonlStreams(t *testing.T, path string, blockSize int) map[string]*rankStream {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]*rankStream{}
	partial := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var rec struct {
			Rank   int           `json:"rank"`
			Type   string        `json:"type"`
			Parent *json.Number  `json:"parent_hash"`
			Hashes []json.Number `json:"hashes"`
			Blocks []struct {
				Hash   json.Number `json:"hash"`
				Tokens []int32     `json:"tokens"`
			} `json:"blocks"`
		}
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		require.NoError(t, d.Decode(&rec))
		key := fmt.Sprint(rec.Rank)
		if out[key] == nil {
			out[key] = &rankStream{}
		}
		s := out[key]
		switch rec.Type {
		case "stored":
			ev := storedEvent{Parent: rec.Parent}
			for _, b := range rec.Blocks {
				if len(b.Tokens) != blockSize {
					partial[key+"/"+b.Hash.String()] = true
					continue
				}
				ev.Hashes = append(ev.Hashes, b.Hash)
				ev.Tokens = append(ev.Tokens, b.Tokens...)
			}
			if len(ev.Hashes) > 0 {
				s.Stored = append(s.Stored, ev)
			}
		case "removed":
			var kept []json.Number
			for _, h := range rec.Hashes {
				if partial[key+"/"+h.String()] {
					delete(partial, key+"/"+h.String())
					continue
				}
				kept = append(kept, h)
			}
			if len(kept) > 0 {
				s.Removed = append(s.Removed, kept)
			}
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// TestKVEventsWithVLLMStructs: `worker serve` on 2 attention-DP ranks
// publishes its KV events over ZeroMQ; a consumer decoding them with
// vLLM's own struct definitions (msgspec, pyzmq; tests/kv_events_consumer.py)
// over a conversation trace, with a subscriber that drops out and replays
// what it missed, sees exactly the stored and removed blocks of the pool's
// own record (--kv-events), rank by rank, and, rebuilding each rank's
// blocks from them as a KV-aware router does, predicts the cached tokens
// that prompts pinned to a rank report.
func TestKVEventsWithVLLMStructs(t *testing.T) {
	m := modeltest.SmolLM2(t)
	py := pyClients(t)
	bin := worker(t)
	dir := t.TempDir()
	record := filepath.Join(dir, "events.jsonl")
	pub, replay := freePorts(t), freePorts(t)
	cmd, base, out := startServe(t, nil, bin, "--model", m, "--ranks", "2", "--pages", "20", "--enable-prompt-tokens-details",
		"--kv-events", record, "--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", replay), "--kv-events-topic", "kv")
	captured := filepath.Join(dir, "zmq.json")
	py.Args = append(py.Args, "kv_events_consumer.py", base, fmt.Sprint(pub), fmt.Sprint(replay), "2", "kv", captured)
	res, err := py.CombinedOutput()
	require.NoError(t, err, "%s\nserver:\n%s", res, out.String())
	require.Contains(t, string(res), "OK")
	t.Logf("consumer: %s", strings.TrimSpace(string(res)))
	stopServe(t, cmd, out)

	b, err := os.ReadFile(captured)
	require.NoError(t, err)
	var got map[string]*rankStream
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	require.NoError(t, d.Decode(&got))
	want := jsonlStreams(t, record, 16) // --tokens-per-page's default
	for _, r := range []string{"0", "1"} {
		require.NotNil(t, got[r], "rank %s", r)
		require.NotNil(t, want[r], "rank %s in the record", r)
		require.NotEmpty(t, want[r].Stored, "rank %s stored nothing", r)
		require.NotEmpty(t, want[r].Removed, "rank %s removed nothing: the pool is too large for the trace", r)
		require.Equal(t, want[r].Stored, got[r].Stored, "rank %s: stored blocks", r)
		require.Equal(t, want[r].Removed, got[r].Removed, "rank %s: removed blocks", r)
		t.Logf("rank %s: %d stored and %d removed events, %d batches live, %d replayed after the drop",
			r, len(got[r].Stored), len(got[r].Removed), got[r].Live, got[r].Missed)
	}
}
