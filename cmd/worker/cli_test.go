package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/stretchr/testify/require"
)

// writeConfig writes a YAML config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// runCLI runs the worker's command line in-process and returns the exit
// status, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// fakeRun is a run of the fake engine on the built-in sample, small.
var fakeRun = []string{"run", "--progress", "off", "--arrival-scale", "0", "--engine", "fake", "--length-scale", "0.05", "--limit", "8"}

// requireUserFacing fails when msg shows a Go internal.
func requireUserFacing(t *testing.T, msg string) {
	t.Helper()
	require.Empty(t, usage.Unreadable(msg), "an error: %s", msg)
}
