// Package modeltest finds the test model (SmolLM2-135M-Instruct, Q4_1 GGUF)
// that scripts/fetch-model.sh installs into the model cache, for tests in
// any package.
package modeltest

import (
	"os"
	"path/filepath"
	"testing"
)

// SmolLM2Name is the test model's file name in the cache; SmolLM2Base is
// its name in `worker serve`'s API (the file name without .gguf).
const (
	SmolLM2Name = "SmolLM2-135M-Instruct.Q4_1.gguf"
	SmolLM2Base = "SmolLM2-135M-Instruct.Q4_1"
)

// CacheDir is $LOCKSTEP_MODEL_CACHE, default ~/.cache/lockstep/models.
func CacheDir() string {
	if d := os.Getenv("LOCKSTEP_MODEL_CACHE"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "lockstep", "models")
}

// SmolLM2 returns the test model's path. Without the file the test is
// skipped, or fails when LOCKSTEP_REQUIRE_MODEL=1 (make test sets it after
// fetching the model, so CI never skips silently).
func SmolLM2(t testing.TB) string {
	t.Helper()
	path := filepath.Join(CacheDir(), SmolLM2Name)
	if _, err := os.Stat(path); err != nil {
		msg := path + " not found: run scripts/fetch-model.sh (cache: LOCKSTEP_MODEL_CACHE or ~/.cache/lockstep/models)"
		if os.Getenv("LOCKSTEP_REQUIRE_MODEL") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}
