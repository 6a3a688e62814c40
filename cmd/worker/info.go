package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
)

// runInfo is `worker info`: what this build supports.
func runInfo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lockstep worker (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(stdout, "engines: fake (pure Go)")
	if b := nativeengine.SupportedBackends(); len(b) > 0 {
		fmt.Fprintf(stdout, ", native: %s", strings.Join(b, ", "))
	} else {
		fmt.Fprintf(stdout, ", native: not built (run make)")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "model presets: %s\n", strings.Join(bridge.PresetNames(), ", "))
	gpuInfo(stdout)
	return nil
}
