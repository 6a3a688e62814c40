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
	require.Equal(t, Keys{Rank: true, Iter: true, GenKVTokens: true, IterMS: true}, keys)
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
	logs, err := ReadCalibrationLogs(files)
	require.NoError(t, err)
	recs := logs.Records
	require.Len(t, recs, 3)
	require.Equal(t, int64(8192), logs.MaxNumTokens)
	require.Equal(t, []int64{16384}, recs[2].CtxKVStart)

	require.NoError(t, os.WriteFile(p, []byte("{\"rank\":0,\"iter\":0}\n\n{\"iter\":1}\n"), 0o644))
	_, err = ReadCalibrationLogs(files)
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
		cl, err := ParseCalibrationLine([]byte(line))
		if err != nil {
			return
		}
		r := cl.Record
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

// The fit's iteration time is the fleet's (fleet_device_ms); a record of
// an older worker falls back to device_ms + wait_ms, with a warning; ranks
// missing from the logs and a truncated last line are warned about, not
// silent and not fatal (issue 23, defect 16).
func TestCalibrationLogsIterationTime(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, recs []executor.IterRecord, tail string) string {
		var b bytes.Buffer
		for _, r := range recs {
			line, err := json.Marshal(r)
			require.NoError(t, err)
			b.Write(append(line, '\n'))
		}
		b.WriteString(tail)
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
		return p
	}
	fleet, wait := 30.0, 20.0
	r0 := logChunk(0, 0, 10, 1, 0)
	r0.FleetDeviceMS, r0.WaitMS = &fleet, wait
	r1 := logChunk(1, 0, 10, 2, 0)
	r1.WaitMS = wait // an older worker: no fleet_device_ms
	a := write("a.0.jsonl", []executor.IterRecord{r0}, "")
	b := write("a.1.jsonl", []executor.IterRecord{r1}, `{"rank":1,"iter":1,"device_ms":`)
	logs, err := ReadCalibrationLogs([]string{a, b})
	require.NoError(t, err)
	require.Len(t, logs.Records, 2)
	require.Equal(t, 30.0, logs.Records[0].DeviceMS, "fleet_device_ms")
	require.Equal(t, 30.0, logs.Records[1].DeviceMS, "device_ms + wait_ms")
	require.Len(t, logs.Warnings, 2, "%v", logs.Warnings)
	require.Contains(t, logs.Warnings[0], b+":2: the last line is cut short")
	require.Contains(t, logs.Warnings[1], "1 records have no fleet_device_ms")

	// One rank alone, then a gap in the ranks.
	logs, err = ReadCalibrationLogs([]string{a})
	require.NoError(t, err)
	require.Len(t, logs.Warnings, 1)
	require.Contains(t, logs.Warnings[0], "the logs hold rank 0 only")
	r3 := logChunk(3, 0, 10, 3, 0)
	r3.FleetDeviceMS = &fleet
	logs, err = ReadCalibrationLogs([]string{a, write("a.3.jsonl", []executor.IterRecord{r3}, "")})
	require.NoError(t, err)
	require.Equal(t, []string{"the logs hold ranks up to 3 but not rank 1, 2: the lockstep figures leave those ranks out"}, logs.Warnings)

	// A bad line that is not the cut-short last one is still an error.
	c := write("c.0.jsonl", nil, "{\"rank\":0,\"iter\":0,\"device_ms\":\n{\"rank\":0,\"iter\":1}\n")
	_, err = ReadCalibrationLogs([]string{c})
	require.ErrorContains(t, err, c+":1:")
}
