package twin_test

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/enginetest"
	"github.com/lockstep-ai/lockstep/bridge/twin"
)

// TestConformance runs the engine conformance suite over the H200 roofline
// profile of the suite's model: the twin holds no page contents (its
// tokens hash the last token and its position), is batch-invariant,
// models its time and treats a second Close as a no-op.
func TestConformance(t *testing.T) {
	enginetest.Run(t, func(cfg bridge.Config) (bridge.Engine, error) {
		p, err := twin.BuiltinProfile("h200", cfg.Preset, twin.Parallelism{})
		if err != nil {
			return nil, err
		}
		e, err := twin.New(cfg, p)
		if err != nil {
			return nil, err
		}
		return e, nil
	}, enginetest.Capabilities{ReadsPages: false, BatchInvariant: true, ModelledTime: true})
}
