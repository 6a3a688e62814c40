//go:build native

package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/workload"
)

// TestEngineThreadLoop (issue 24 item 3): a rank whose loop runs on its
// engine's thread (executor.Config.EngineThread, as the fleet runs native
// engines) generates the same tokens as one that hands every call over,
// on 1 and 2 ranks, in both loops and under recompute preemption; and its
// iteration log's host_ms leaves the engine's compute out (the compute
// runs on the loop's own thread there).
func TestEngineThreadLoop(t *testing.T) {
	var reqs []workload.Request
	for i := range 6 {
		reqs = append(reqs, workload.Request{Index: i, Prompt: workload.AppendBlockTokens(nil, uint64(700+i), 40, 512, 3),
			MaxNewTokens: 12})
	}
	src := seededSource{params: bridge.SamplingParams{Temperature: 0.8, TopK: 40}, seedBase: 900}
	ref := serveCPUWith(t, reqs, cpuRun{ranks: 1, chunked: true, pages: 128, src: src})
	for _, c := range []cpuRun{
		{ranks: 1, chunked: true, pages: 128},
		{ranks: 2, overlap: true, chunked: true, pages: 128},
		{ranks: 2, pages: 16},
	} {
		c.src, c.engineThread = src, true
		logs := make([]bytes.Buffer, c.ranks)
		for i := range logs {
			c.iterLogs = append(c.iterLogs, io.Writer(&logs[i]))
		}
		require.Equal(t, ref, serveCPUWith(t, reqs, c), "ranks %d, overlap %v, pages %d", c.ranks, c.overlap, c.pages)
		var host, device []float64
		sc := bufio.NewScanner(&logs[0])
		for sc.Scan() {
			var rec executor.IterRecord
			require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
			if rec.DeviceMS != nil && *rec.DeviceMS > 0 {
				host, device = append(host, rec.HostMS), append(device, *rec.DeviceMS)
			}
		}
		require.NotEmpty(t, device, "no forward iteration logged")
		slices.Sort(host)
		slices.Sort(device)
		// The tiny model's step costs milliseconds of compute, the host
		// side tens of microseconds: with the compute in host_ms the
		// medians would be alike.
		require.Less(t, host[len(host)/2], device[len(device)/2]/2,
			"median host_ms %.3f against median device_ms %.3f: the engine's compute is in host_ms", host[len(host)/2], device[len(device)/2])
	}
}
