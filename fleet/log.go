package fleet

import (
	"io"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockstep-ai/lockstep/scheduler"
)

func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, usage.Errorf("--log-level: %v", err)
	}
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = "ts"
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.EncodeLevel = zapcore.CapitalLevelEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}

// logNote maps a scheduler log line to zap.
func logNote(log *zap.Logger, n scheduler.Note) {
	switch n.Level {
	case scheduler.LevelDebug:
		log.Debug(n.Text)
	case scheduler.LevelInfo:
		log.Info(n.Text)
	default:
		log.Warn(n.Text)
	}
}

// NewLogger is the fleet's logger (console encoding to w) at level: the
// same lines as the ranks' for the HTTP server of `worker serve`.
func NewLogger(w io.Writer, level string) (*zap.Logger, error) { return newLogger(w, level) }
