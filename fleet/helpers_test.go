package fleet

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockstep-ai/lockstep/internal/usage"
)

// runCLI runs `worker run ARGS` (args[0] is "run") as the worker does
// (parse, run, print the report), and returns its exit status and output.
// The environment is the process's.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	require.Equal(t, "run", args[0], "the fleet runs `worker run` only")
	var out, errb bytes.Buffer
	err := runArgs(args[1:], &out, &errb)
	code := 0
	if err != nil {
		fmt.Fprintf(&errb, "worker run: %v\n", err)
		code = 1
		if usage.Is(err) {
			code = 2
		}
	}
	return code, out.String(), errb.String()
}

// runArgs parses, runs and prints as `worker run` does.
func runArgs(args []string, stdout, stderr io.Writer) error {
	o, err := ParseArgs(args, stderr)
	if err != nil {
		return err
	}
	out, err := Run(o, stderr, os.Getenv)
	if err != nil || out == nil {
		return err
	}
	return out.Print(stdout, o.Report)
}
