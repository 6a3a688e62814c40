package executor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// The owning rank's admission: a request that fits the pool but not the
// pages available now (WaitForPages) enters active and waits, exactly like
// one that fits; only one that never fits is answered, with its reason.
func TestAdmitWaitsForPagesRejectsNeverFits(t *testing.T) {
	e, _, pool := unitExec(t, 0, 1, 4, nil)                        // 4 pages × 8 tokens
	require.True(t, pool.AddDummy(&scheduler.Request{ID: 77}, 24)) // 3 pages taken
	waits := arrival(1, 20, 4)                                     // 3 pages for its prompt, 1 available
	require.Equal(t, scheduler.WaitForPages, e.verdict(newRequest(waits)).Code)
	e.admit(waits, scheduler.UnsetEstimate)
	require.Equal(t, []uint64{1}, activeIDs(e))
	require.Empty(t, e.pending)

	fits := arrival(2, 4, 2)
	require.Equal(t, scheduler.AdmissionVerdict{}, e.verdict(newRequest(fits)))
	e.admit(fits, scheduler.UnsetEstimate)
	require.Equal(t, []uint64{1, 2}, activeIDs(e))

	e.admit(arrival(3, 30, 3), scheduler.UnsetEstimate) // 33 tokens > the 32-token pool
	require.Equal(t, []uint64{1, 2}, activeIDs(e))
	require.Len(t, e.pending, 1)
	require.Equal(t, "prompt 30 + max_new_tokens 3 = 33 tokens can never fit the KV pool of 32 tokens (4 pages × 8)", e.pending[0].Error)
	require.Equal(t, 0, e.pending[0].Rank)
}
