package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/executor"
)

// A run whose ranks outnumber the cores says so beside the lockstep waste,
// in the text and the JSON report; one that fits says nothing (issue 23).
func TestReportNamesCPUContention(t *testing.T) {
	res := &executor.Result{LockstepWaste: 0.652}
	for _, c := range []struct {
		ranks, cores int
		want         bool
	}{{4, 2, true}, {2, 2, false}, {4, 0, false}} {
		rep := Build(RunInfo{Engine: "cpu", Ranks: 4, RanksHere: c.ranks, Cores: c.cores}, nil, res)
		var text bytes.Buffer
		require.NoError(t, rep.WriteText(&text))
		b, err := json.Marshal(rep)
		require.NoError(t, err)
		if c.want {
			require.Contains(t, text.String(), "(4 ranks shared 2 cores here: the waste measures ranks waiting for a core, not scheduling)")
			require.Contains(t, string(b), `"cpu_contention":{"ranks":4,"cores":2}`)
		} else {
			require.NotContains(t, text.String(), "cores here")
			require.NotContains(t, string(b), "cpu_contention")
		}
	}
}
