//go:build !native

package native

import (
	"strings"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
)

func TestOpenWithoutNativeEngine(t *testing.T) {
	eng, err := Open(bridge.Config{Preset: "tiny", NumPages: 4, TokensPerPage: 4})
	if err == nil || eng != nil {
		t.Fatalf("Open = %v, %v; want an error", eng, err)
	}
	if !strings.Contains(err.Error(), "-tags native") {
		t.Errorf("error %q does not say how to build with the engine", err)
	}
	if got := SupportedBackends(); len(got) != 0 {
		t.Errorf("SupportedBackends() = %v, want none", got)
	}
}
