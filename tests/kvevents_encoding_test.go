package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/kvpool"
	"github.com/lockstep-ai/lockstep/scheduler"
	"github.com/lockstep-ai/lockstep/serve/kvevents"
)

// decodeWithVLLM is a msgspec decoder of vLLM's structs in both layouts:
// "array" (vLLM <= 0.11: array_like events) and "map" (later vLLM: tagged
// map events); it prints each event's tag and block hashes as JSON.
const decodeWithVLLM = `
import json, sys
from typing import Any
import msgspec

class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None

def structs(array_like):
    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass
    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]
        medium: str | None
        group_idx: int | None = None
    class AllBlocksCleared(KVCacheEvent):
        pass
    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    return KVEventBatch

layout, path = sys.argv[1], sys.argv[2]
batch = msgspec.msgpack.decode(open(path, "rb").read(), type=structs(layout == "array"))
print(json.dumps([[type(e).__name__, [str(h) for h in e.block_hashes]] for e in batch.events] + [batch.data_parallel_rank]))
`

// TestKVEventEncodingsDecodeWithVLLMStructs: both encodings of
// serve/kvevents decode with msgspec into vLLM's structs of the matching
// layout (array_like events for "array", tagged maps for "map").
func TestKVEventEncodingsDecodeWithVLLMStructs(t *testing.T) {
	out, err := exec.Command("../scripts/ensure-pyclient.sh").Output()
	if err != nil {
		if os.Getenv("LOCKSTEP_REQUIRE_MODEL") == "1" {
			t.Fatalf("the Python clients (msgspec) could not be installed: %v", err)
		}
		t.Skipf("the Python clients (msgspec) could not be installed: %v", err)
	}
	lines := strings.Fields(string(out))
	var k1, k2 scheduler.BlockKey
	k1[0], k2[0] = 0xfe, 7
	evs := []kvpool.Event{
		{Kind: kvpool.EventStored, Blocks: []kvpool.StoredBlock{{Hash: k1, Tokens: []int32{1, 2}}, {Hash: k2, Tokens: []int32{3, 4}}}},
		{Kind: kvpool.EventRemoved, Hashes: []scheduler.BlockKey{k2}},
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "decode.py"), []byte(decodeWithVLLM), 0o644))
	h := func(k scheduler.BlockKey) string { return strconv.FormatUint(kvpool.BlockHash64(k), 10) }
	want := []any{[]any{"BlockStored", []any{h(k1), h(k2)}}, []any{"BlockRemoved", []any{h(k2)}}, 3.0}
	for _, enc := range []string{kvevents.EncodingArray, kvevents.EncodingMap} {
		payload, n := kvevents.EncodeBatch(1.5, evs, 3, enc)
		require.Equal(t, 2, n)
		path := filepath.Join(dir, enc+".bin")
		require.NoError(t, os.WriteFile(path, payload, 0o644))
		cmd := exec.Command(lines[0], filepath.Join(dir, "decode.py"), enc, path)
		if len(lines) > 1 {
			cmd.Env = append(os.Environ(), "PYTHONPATH="+lines[1])
		}
		res, err := cmd.Output()
		require.NoError(t, err, "%s", res)
		var got []any
		require.NoError(t, json.Unmarshal(res, &got), "%s", res)
		require.Equal(t, want, got, enc)
	}
}
