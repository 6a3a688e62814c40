//go:build !cgo

package main

import (
	"errors"
	"fmt"
	"io"
)

// errNoCgo is returned by GPU discovery in builds without cgo: go-nvml
// needs cgo to load libnvidia-ml.
var errNoCgo = errors.New("GPU discovery needs cgo (build with CGO_ENABLED=1 and -tags nvml)")

// gpuInfo reports that this build cannot discover GPUs.
func gpuInfo(w io.Writer) {
	fmt.Fprintf(w, "GPUs: unknown (%v)\n", errNoCgo)
}

// gpuFreeMemory always fails in a build without cgo.
func gpuFreeMemory(device int) (uint64, error) {
	return 0, fmt.Errorf("reading free memory of GPU %d: %w", device, errNoCgo)
}
