package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Spec §18.14: the stall detector.
func TestStallDetector(t *testing.T) {
	t.Run("T-STL-01", func(t *testing.T) {
		s := mustNew(t, baseConfig(), newFakeKV())
		for i := 0; i < 5000; i++ {
			out, err := s.Schedule(nil, nil)
			require.NoError(t, err)
			require.Zero(t, out.StallCount)
			require.Empty(t, out.Notes)
		}
	})

	// stuck is [ctx(0,100)] whose resize always fails and has no victim.
	stuck := func(t *testing.T, extra ...*Request) (*Scheduler, *fakeKV, []*Request) {
		f := newFakeKV()
		f.resizeFn = resizeFailIDs(0)
		list := append([]*Request{ctx(0, 100)}, extra...)
		f.register(list)
		return mustNew(t, baseConfig(), f), f, list
	}
	t.Run("T-STL-02", func(t *testing.T) {
		s, _, list := stuck(t)
		var warned []int
		for pass := 1; pass < 1000; pass++ {
			out, err := s.Schedule(list, nil)
			require.NoError(t, err, "pass %d", pass)
			require.Equal(t, pass, out.StallCount)
			for _, n := range out.Notes {
				if n.Level == LevelWarn {
					warned = append(warned, pass)
					require.Contains(t, n.Text, "no progress for")
				}
			}
			if pass == 1 {
				require.Len(t, out.Notes, 1)
				require.Equal(t, LevelDebug, out.Notes[0].Level)
			}
		}
		require.Equal(t, []int{250, 500, 750}, warned)
		_, err := s.Schedule(list, nil)
		require.ErrorIs(t, err, ErrStalled)
		require.ErrorContains(t, err, "id=0 state=CONTEXT_INIT kv=none")
	})
	t.Run("T-STL-03", func(t *testing.T) {
		s, f, list := stuck(t)
		for pass := 1; pass <= 999; pass++ {
			_, err := s.Schedule(list, nil)
			require.NoError(t, err)
		}
		f.resizeFn = nil
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Zero(t, out.StallCount)
		require.Equal(t, []uint64{0}, ids(out.Context))
	})
	t.Run("T-STL-04", func(t *testing.T) {
		s, _, list := stuck(t, gen(1))
		for pass := 1; pass <= 1200; pass++ {
			out, err := s.Schedule(list, nil)
			require.NoError(t, err)
			require.Zero(t, out.StallCount)
			require.Equal(t, []uint64{1}, ids(out.Generation))
		}
	})
	t.Run("T-STL-05", func(t *testing.T) {
		f := newFakeKV()
		f.allocFn = allocNever
		list := []*Request{gen(0)}
		f.register(list)
		s := mustNew(t, baseConfig(), f)
		out, err := s.Schedule(list, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{0}, ids(out.Paused))
		require.Zero(t, out.StallCount)
		for pass := 2; pass <= 1000; pass++ {
			out, err = s.Schedule(list, nil)
			require.NoError(t, err)
			require.Empty(t, out.Paused, "a suspended requester reports nothing")
			require.Equal(t, pass-1, out.StallCount)
		}
		_, err = s.Schedule(list, nil) // pass 1 001
		require.ErrorIs(t, err, ErrStalled)
		require.ErrorContains(t, err, "kv=suspended")
		require.NotContains(t, err.Error(), "recompute pause disabled", "recompute pause is on: not the no-valve case")
	})
	// The same stall with recompute pause off and no host tier: nothing can
	// ever free a page, and the error says which settings leave no valve.
	t.Run("no valve named", func(t *testing.T) {
		for _, host := range []bool{false, true} {
			f := newFakeKV()
			f.host = host
			f.allocFn = allocNever
			list := []*Request{gen(0)}
			f.register(list)
			c := baseConfig()
			c.RecomputePause = false
			c.Names = SettingNames{SettingRecomputePause: "scheduler.enable_recompute_pause in cfg.yaml"}
			s := mustNew(t, c, f)
			var err error
			for pass := 1; pass <= 1001 && err == nil; pass++ {
				_, err = s.Schedule(list, nil)
			}
			require.ErrorIs(t, err, ErrStalled)
			if host {
				require.NotContains(t, err.Error(), "no host tier", "a host tier is a valve")
				continue
			}
			require.ErrorContains(t, err, "max_utilization with recompute pause disabled "+
				"(scheduler.enable_recompute_pause in cfg.yaml) and no host tier frees no KV page under pressure")
		}
	})
	t.Run("T-STL-06", func(t *testing.T) {
		s, _, list := helixSetup(t, true, gen(0))
		for pass := 1; pass < 1000; pass++ {
			out, err := s.Schedule(list, nil)
			require.NoError(t, err)
			require.Equal(t, []uint64{0}, ids(out.SatOut))
			require.Equal(t, pass, out.StallCount)
		}
		_, err := s.Schedule(list, nil)
		require.ErrorIs(t, err, ErrStalled)
	})
	t.Run("idle with only preempted contexts", func(t *testing.T) {
		// Everything pending was preempted: an idle pass, not a stall.
		s := mustNew(t, baseConfig(), newFakeKV())
		s.begin([]*Request{ctx(0, 10)}, nil)
		s.pending = append(s.pending, 0)
		s.flags[0] |= flagPreempted
		require.True(t, s.idle())
		s.flags[0] = 0
		require.False(t, s.idle())
	})
}
