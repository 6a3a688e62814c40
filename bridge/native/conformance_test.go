//go:build native

package native

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/enginetest"
)

// TestConformance runs the engine conformance suite on the CPU backend: it
// attends over its pages, is bit-exact and batch-invariant (DESIGN.md §3),
// measures its time, and a second Close fails with bridge.ErrClosed.
func TestConformance(t *testing.T) {
	enginetest.Run(t, func(cfg bridge.Config) (bridge.Engine, error) {
		cfg.Backend = "cpu"
		return Open(cfg)
	}, enginetest.Capabilities{ReadsPages: true, BatchInvariant: true, SecondCloseErrClosed: true})
}
