package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// logChunk is one iteration-log record with a single full chunk of 8 192
// tokens at depth kv, written with the executor's own record type.
func logChunk(rank int, it int64, deviceMS float64, id uint64, kv int) executor.IterRecord {
	m := 8192
	return executor.IterRecord{V: 1, Rank: rank, Iter: it, DeviceMS: &deviceMS, CanQueue: true,
		NumCtxRequests: 1, CtxTokens: m, CtxRequestIDs: []uint64{id}, CtxKVStart: []int{kv},
		CtxChunkTokens: []int{m}, CtxCachedKVTokens: kv,
		CostS: float64(m) * (float64(kv) + float64(m)/2), MaxNumTokens: &m}
}

// TestDecodeIterRecordKeys: the keys a record type cannot tell apart from
// zero are reported as present or absent.
func TestDecodeIterRecordKeys(t *testing.T) {
	b, err := json.Marshal(logChunk(0, 0, 5, 1, 0))
	require.NoError(t, err)
	rec, keys, err := DecodeIterRecord(b)
	require.NoError(t, err)
	require.Equal(t, Keys{Rank: true, Iter: true, GenKVTokens: true}, keys)
	require.Equal(t, 8192, rec.CtxTokens)
	_, keys, err = DecodeIterRecord([]byte(`{"rank": null, "iter": 3}`))
	require.NoError(t, err)
	require.Equal(t, Keys{Iter: true}, keys)
	_, _, err = DecodeIterRecord([]byte(`{"iter": "x"}`))
	require.Error(t, err)
}

// TestReadCalibrationRecords: records of every file in order, the budget
// they agree on, and errors that name the file and line.
func TestReadCalibrationRecords(t *testing.T) {
	dir := t.TempDir()
	var b bytes.Buffer
	for it := range int64(3) {
		line, err := json.Marshal(logChunk(0, it, 100, 1, 8192*int(it)))
		require.NoError(t, err)
		b.Write(append(line, '\n', '\n'))
	}
	p := filepath.Join(dir, "iter.0.jsonl")
	require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
	files, err := ExpandLogPaths([]string{filepath.Join(dir, "iter.{rank}.jsonl")})
	require.NoError(t, err)
	require.Equal(t, []string{p}, files)
	recs, m, err := ReadCalibrationRecords(files)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, int64(8192), m)
	require.Equal(t, []int64{16384}, recs[2].CtxKVStart)

	require.NoError(t, os.WriteFile(p, []byte("{\"rank\":0,\"iter\":0}\n\n{\"iter\":1}\n"), 0o644))
	_, _, err = ReadCalibrationRecords(files)
	require.EqualError(t, err, p+`:3: a record needs "rank" and "iter" (is this an iteration log written by --iter-log?)`)
}

// FuzzCalibrateLine: any line either is refused with an error or yields a
// record the fit digests without panicking (and whose result encodes).
func FuzzCalibrateLine(f *testing.F) {
	rec, _ := json.Marshal(logChunk(0, 3, 5000, 1, 400_000))
	f.Add(string(rec))
	f.Add(`{"rank":1,"iter":0,"device_ms":null,"num_ctx_requests":2,"ctx_request_ids":[1,2],"ctx_kv_start":[0,5]}`)
	f.Add(`{"rank":0,"iter":-4,"ctx_tokens":1,"cost_s":1e300}`)
	f.Fuzz(func(t *testing.T, line string) {
		r, _, err := ParseCalibrationLine([]byte(line))
		if err != nil {
			return
		}
		// The record, its successor and a peer: enough for every step to run.
		next := r
		next.Iter++
		peer := r
		peer.Rank++
		opt := costfit.DefaultOptions()
		opt.MinSpan, opt.WarmupIters = 1, 0
		res, err := costfit.Fit([]costfit.Record{r, next, peer}, opt)
		if err == nil {
			var b bytes.Buffer
			require.NoError(t, res.Format(&b))
		}
	})
}
