package fleet

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/report"
)

// TestPrintFailsOnUnansweredRequests: a run whose report counts fewer
// answers (served or rejected) than requests fails after printing it:
// a request the fleet lost is a bug to report, not a figure ("12 total,
// 8 completed, 0 rejected" once passed as a run that served 8).
func TestPrintFailsOnUnansweredRequests(t *testing.T) {
	rep := &report.Report{}
	rep.Requests.Total, rep.Requests.Completed, rep.Requests.Rejected = 12, 8, 1
	for _, format := range []string{"text", "json"} {
		err := (&Outcome{Report: rep}).Print(io.Discard, format)
		require.ErrorContains(t, err, "3 of 12 requests were never answered", format)
	}
	rep.Requests.Rejected = 4
	require.NoError(t, (&Outcome{Report: rep}).Print(io.Discard, "json"))
}
