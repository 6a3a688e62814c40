package fleet

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/scheduler"
)

// TestRankLinesCarryTheRankOnce: a rank's lines name it once, whether the
// ranks share one process's logger or each process's logger already
// carries its rank (a repeated key is invalid for JSON log readers).
func TestRankLinesCarryTheRankOnce(t *testing.T) {
	for _, tagged := range []bool{false, true} {
		var buf bytes.Buffer
		log, err := NewLogger(&buf, "debug")
		require.NoError(t, err)
		if tagged {
			log = log.With(zap.Int("rank", 3))
		}
		s := &rankSetup{log: log, rankTagged: tagged}
		s.rankLog(3).Info("KV events", zap.String("endpoint", "tcp://*:5557"))
		logNote(s.rankLog(3), scheduler.Note{Level: scheduler.LevelInfo, Text: "a note"})
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		require.Len(t, lines, 2)
		for _, l := range lines {
			require.Equal(t, 1, strings.Count(l, `"rank": 3`), "tagged=%v: %s", tagged, l)
		}
	}
}
