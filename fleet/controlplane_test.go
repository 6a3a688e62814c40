package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestControlPlaneNCCL: only the cuda engine asks for NCCL, always with the
// CPU fallback, and the native bound exceeds the watchdog's.
func TestControlPlaneNCCL(t *testing.T) {
	for _, engine := range []string{"cpu", "twin", "fake"} {
		require.Nil(t, controlPlaneNCCL(engine, 0, time.Minute), engine)
	}
	o := controlPlaneNCCL("cuda", 3, time.Minute)
	require.NotNil(t, o)
	require.True(t, o.Fallback)
	require.NotNil(t, o.UniqueID)
	require.NotNil(t, o.Open)
	require.Greater(t, nativeNCCLTimeout(time.Minute), time.Minute)
	require.Equal(t, 10*time.Minute, nativeNCCLTimeout(0))
}
