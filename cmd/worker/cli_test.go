package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

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

// goIsms are fragments of Go's own error texts (type names, struct dumps,
// decoder internals) that a user-facing error must never show.
var goIsms = []string{"main.", "fleet.", "scenario.", "struct {", "interface {", "*int", "[]uint8", "yaml: unmarshal", "reflect", "json:\""}

// requireUserFacing fails when msg shows a Go-ism.
func requireUserFacing(t *testing.T, msg string) {
	t.Helper()
	for _, g := range goIsms {
		require.NotContains(t, msg, g, "an error shows a Go internal: %s", msg)
	}
}
