package usage

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUsageErrors(t *testing.T) {
	err := Errorf("--ranks must be at least 1, got %d", 0)
	require.True(t, Is(err))
	require.True(t, Is(fmt.Errorf("worker run: %w", err)), "seen through wrapping")
	require.False(t, Is(errors.New("disk full")))
	require.NoError(t, Wrap(nil))
	base := errors.New("bad")
	require.ErrorIs(t, Wrap(base), base)
	require.Equal(t, "bad", Wrap(base).Error())
	require.NoError(t, OneOf("--engine", "cpu", "cpu", "twin"))
	e := OneOf("--engine", "gpu", "cpu", "twin")
	require.True(t, Is(e))
	require.EqualError(t, e, `--engine "gpu" is not allowed (allowed: cpu, twin)`)
	require.Empty(t, Unreadable("--ranks must be at least 1, got 0"))
	require.Equal(t, "empty message", Unreadable(" "))
	require.Contains(t, Unreadable("json: cannot unmarshal string into Go struct field main.x"), "main.")
}
