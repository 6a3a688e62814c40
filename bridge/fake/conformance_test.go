package fake_test

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/enginetest"
	"github.com/lockstep-ai/lockstep/bridge/fake"
)

// TestConformance runs the engine conformance suite: the fake reads its
// pages back (its tokens hash them), is batch-invariant, models its time
// and treats a second Close as a no-op.
func TestConformance(t *testing.T) {
	enginetest.Run(t, func(cfg bridge.Config) (bridge.Engine, error) {
		e, err := fake.New(cfg)
		if err != nil {
			return nil, err
		}
		return e, nil
	}, enginetest.Capabilities{ReadsPages: true, BatchInvariant: true, ModelledTime: true})
}
