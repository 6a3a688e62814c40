//go:build !native

package native

import (
	"errors"
	"fmt"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// errNotBuilt is what every entry point returns in a build without the engine.
var errNotBuilt = errors.New("built without the native engine: build with `make` (go build -tags native)")

// Open would start a native engine; this build has none, so it always fails.
func Open(cfg bridge.Config) (bridge.Engine, error) {
	return nil, fmt.Errorf("native engine (backend %q): %w", cfg.Backend, errNotBuilt)
}

// SupportedBackends lists the backends of the native library: none in this build.
func SupportedBackends() []string { return nil }

// DequantizeRow would convert a row with the native library; this build has none.
func DequantizeRow(dtype bridge.DType, data []byte, cols int64) ([]float32, error) {
	return nil, fmt.Errorf("native DequantizeRow: %w", errNotBuilt)
}

// PresetShape would ask the native library for a preset's shape; this build
// has no library, so it always fails.
func PresetShape(name string) (bridge.ModelShape, error) {
	return bridge.ModelShape{}, fmt.Errorf("native preset %q: %w", name, errNotBuilt)
}

// CPGroup is the native Helix CP group; this build has none.
type CPGroup struct{}

// NewCPGroup always fails in a build without the native engine.
func NewCPGroup(size int, timeout time.Duration) (*CPGroup, error) {
	return nil, fmt.Errorf("native Helix CP group: %w", errNotBuilt)
}

// Size is 0: the stub group has no members.
func (g *CPGroup) Size() int { return 0 }

// NewMPICPGroup always fails in a build without the native engine.
func NewMPICPGroup(color int, timeout time.Duration) (*CPGroup, error) {
	return nil, fmt.Errorf("native MPI exchange group: %w", errNotBuilt)
}

// NewTCPCPGroup always fails in a build without the native engine.
func NewTCPCPGroup(rank, size int, host string, secret []byte, timeout time.Duration,
	gather func(addr []byte) ([][]byte, error)) (*CPGroup, error) {
	return nil, fmt.Errorf("native TCP exchange group: %w", errNotBuilt)
}

// LocalRank is -1: this build has no groups.
func (g *CPGroup) LocalRank() int { return -1 }

// Close does nothing.
func (g *CPGroup) Close() error { return nil }

// MoEStats are a native engine's MoE exchange counters; see the native build.
type MoEStats struct {
	Exchanges     uint64
	BytesSent     uint64
	BytesReceived uint64
	TokensRouted  uint64
	WaitMS        float64
}

// EngineMoEStats always fails in a build without the native engine.
func EngineMoEStats(eng bridge.Engine) (MoEStats, error) {
	return MoEStats{}, fmt.Errorf("native MoE statistics: %w", errNotBuilt)
}
