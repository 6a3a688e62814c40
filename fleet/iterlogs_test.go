package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSelectLogRanks(t *testing.T) {
	sel, w := selectLogRanks("", 4)
	require.Equal(t, []bool{true, false, false, false}, sel)
	require.Empty(t, w)
	sel, _ = selectLogRanks("all", 3)
	require.Equal(t, []bool{true, true, true}, sel)
	sel, _ = selectLogRanks(" 0, 2", 4)
	require.Equal(t, []bool{true, false, true, false}, sel)
	sel, w = selectLogRanks("1,x", 3)
	require.Equal(t, []bool{false, true, false}, sel)
	require.Contains(t, w, `"x"`)
}
