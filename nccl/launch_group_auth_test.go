package nccl_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockstep-ai/lockstep/nccl"
)

// openTorchrunWorld opens a torchrun-style world of goroutine ranks on
// loopback, rank r with tokens[r] in LOCKSTEP_JOB_TOKEN ("" = unset), and
// returns each rank's group (nil on failure), error, time taken and logs.
func openTorchrunWorld(t *testing.T, tokens []string, connect time.Duration) ([]*nccl.ProcessGroup, []error, []time.Duration, []*observer.ObservedLogs) {
	t.Helper()
	size := len(tokens)
	port := freePort(t)
	groups := make([]*nccl.ProcessGroup, size)
	elapsed := make([]time.Duration, size)
	logs := make([]*observer.ObservedLogs, size)
	errs := runAll(t, size, func(r int) error {
		env := map[string]string{"RANK": fmt.Sprint(r), "WORLD_SIZE": fmt.Sprint(size),
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": fmt.Sprint(port), nccl.JobTokenEnv: tokens[r]}
		l, err := nccl.DetectLaunch(func(k string) string { return env[k] })
		if err != nil {
			return err
		}
		core, observed := observer.New(zapcore.DebugLevel)
		logs[r] = observed
		start := time.Now()
		groups[r], err = nccl.OpenProcessGroup(l, nccl.GroupOptions{CollectiveTimeout: 5 * time.Second,
			ConnectTimeout: connect, Logger: zap.New(core)})
		elapsed[r] = time.Since(start)
		return err
	})
	t.Cleanup(func() {
		for r := size - 1; r >= 0; r-- {
			if groups[r] != nil {
				groups[r].Close()
			}
		}
	})
	return groups, errs, elapsed, logs
}

// warnings returns the messages of the warnings in logs.
func warnings(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
		out = append(out, e.Message)
	}
	return out
}

// tokenWarnings returns the warnings about the job token in logs.
func tokenWarnings(logs *observer.ObservedLogs) []string {
	var out []string
	for _, w := range warnings(logs) {
		if strings.HasPrefix(w, nccl.JobTokenEnv+" is") {
			out = append(out, w)
		}
	}
	return out
}

// TestProcessGroupJobToken: with the same token on every rank the world
// forms without a warning; without one it forms and every rank warns how to
// set it; a token on some ranks only, or different tokens, fail with an
// error that names the mismatch: the odd rank at once, rank 0 at its
// connect timeout (it cannot tell a misconfigured rank from an impostor, so
// it keeps waiting for the real one).
func TestProcessGroupJobToken(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	connect := time.Second
	for _, tc := range []struct {
		name         string
		tokens       []string
		rank1, rank0 string // wanted error fragments ("" = success)
		warn         string
	}{
		{name: "same token", tokens: []string{secret, secret, secret}},
		{name: "no token", tokens: []string{"", "", ""},
			warn: "LOCKSTEP_JOB_TOKEN is not set: rank 0's bootstrap store (127.0.0.1:"},
		{name: "different tokens", tokens: []string{secret, secret + "x", secret},
			rank1: "rank 0's bootstrap store refused rank 1: the peer (claiming rank 1) does not prove the job token: LOCKSTEP_JOB_TOKEN differs from rank 0's",
			rank0: "bootstrap store rejected 1 connection(s): 127.0.0.1:"},
		{name: "token on rank 0 only", tokens: []string{secret, "", secret},
			rank1: "rank 0's bootstrap store requires a job token and LOCKSTEP_JOB_TOKEN is not set on rank 1: set the same LOCKSTEP_JOB_TOKEN on every rank",
			rank0: "the peer (claiming rank 1) has no job token and rank 0 requires one", warn: "LOCKSTEP_JOB_TOKEN is not set"},
		{name: "token on rank 1 only", tokens: []string{"", secret, ""},
			rank1: "LOCKSTEP_JOB_TOKEN is set on rank 1 but rank 0's bootstrap store runs without a job token: set the same LOCKSTEP_JOB_TOKEN on every rank, or on none",
			rank0: "the peer (claiming rank 1) has a job token and rank 0 has none", warn: "LOCKSTEP_JOB_TOKEN is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			groups, errs, elapsed, logs := openTorchrunWorld(t, tc.tokens, connect)
			if tc.rank1 == "" {
				for r := range groups {
					require.NoError(t, errs[r], "rank %d", r)
				}
				errs := runAll(t, len(groups), func(r int) error { return exerciseCollectives(groups[r].Comm) })
				for r, err := range errs {
					require.NoError(t, err, "rank %d", r)
				}
			} else {
				require.ErrorIs(t, errs[1], nccl.ErrAuth)
				require.ErrorContains(t, errs[1], tc.rank1)
				require.Less(t, elapsed[1], connect, "rank 1 fails at once")
				require.ErrorIs(t, errs[0], nccl.ErrTimeout)
				require.ErrorContains(t, errs[0], "missing [1]")
				require.ErrorContains(t, errs[0], tc.rank0)
				// Rank 2, admitted, learns why the group did not form.
				require.Error(t, errs[2])
				if !errors.Is(errs[2], nccl.ErrTimeout) {
					require.ErrorContains(t, errs[2], "rank 0's tcp transport refused rank 2: rank 0 gave up: tcp transport: rank 0 waited 1s for the other ranks, missing [1]")
				}
			}
			if tc.rank1 != "" {
				require.Contains(t, warnings(logs[0]), "bootstrap store: closed a connection that failed the hello")
			}
			for r, l := range logs {
				w := tokenWarnings(l)
				wantWarn := tc.warn != "" && tc.tokens[r] == ""
				if !wantWarn {
					require.Empty(t, w, "rank %d", r)
					continue
				}
				require.NotEmpty(t, w, "rank %d", r)
				require.Contains(t, w[0], tc.warn, "rank %d", r)
				require.Contains(t, w[0], "export LOCKSTEP_JOB_TOKEN=$(openssl rand -hex 32)")
			}
		})
	}
}

// TestProcessGroupShortTokenWarns: a token too short to resist guessing
// draws a warning (and still works).
func TestProcessGroupShortTokenWarns(t *testing.T) {
	noLeaks(t)
	groups, errs, _, logs := openTorchrunWorld(t, []string{"short", "short"}, 5*time.Second)
	for r := range groups {
		require.NoError(t, errs[r])
		w := warnings(logs[r])
		require.Len(t, w, 1)
		require.True(t, strings.HasPrefix(w[0], "LOCKSTEP_JOB_TOKEN is 5 bytes long"), w[0])
		require.NotContains(t, w[0], "short")
	}
}
