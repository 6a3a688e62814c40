package tests

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/lockstep-ai/lockstep"

// imports lists every package of the module (non-test files, with the given
// build tags) and its direct imports.
func imports(t *testing.T, tags string) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, module+"/...")...).CombinedOutput()
	require.NoError(t, err, string(out))
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		m[pkg] = strings.Fields(deps)
	}
	return m
}

// TestDependencyRules enforces DESIGN.md §1.
func TestDependencyRules(t *testing.T) {
	for _, tags := range []string{"", "native"} {
		all := imports(t, tags)
		pure := []string{"scheduler", "scheduler/router", "scheduler/costfit", "kvpool"}
		forbidden := map[string]bool{"time": true, "math/rand": true, "math/rand/v2": true, "os": true,
			"net": true, "sync": true, "io": true, "C": true, "unsafe": true, "runtime": true}
		// costfit's Result.Format writes to a caller's io.Writer: the
		// interface only, the package itself opens nothing.
		allowed := map[string]map[string]bool{"scheduler/costfit": {"io": true}}
		for _, p := range pure {
			deps, ok := all[module+"/"+p]
			if !ok {
				continue // package not written yet
			}
			for _, d := range deps {
				if strings.HasPrefix(d, module+"/") {
					rel := strings.TrimPrefix(d, module+"/")
					require.Contains(t, pure, rel, "%s may import only the other pure packages, imports %s", p, d)
					continue
				}
				require.NotContains(t, d, ".", "%s imports a non-standard package %s", p, d)
				require.False(t, forbidden[d] && !allowed[p][d], "%s imports %s: the scheduling core has no I/O, clock, randomness, goroutines or cgo", p, d)
			}
		}
		// The twin engine: standard library, bridge and bridge's internal
		// packages only (the code it shares with the fake), and no clock or
		// randomness (its time is modelled, its tokens a hash) in the twin
		// or in the internal packages it imports.
		twin := []string{module + "/bridge/twin"}
		for i := 0; i < len(twin); i++ {
			for _, d := range all[twin[i]] {
				if strings.HasPrefix(d, module+"/bridge/internal/") {
					if !slices.Contains(twin, d) {
						twin = append(twin, d)
					}
					continue
				}
				if strings.HasPrefix(d, module+"/") {
					require.Equal(t, module+"/bridge", d, "%s (the twin) may import only bridge and bridge/internal/..., imports %s", twin[i], d)
					continue
				}
				require.NotContains(t, d, ".", "%s (the twin) imports a non-standard package %s", twin[i], d)
				require.False(t, d == "time" || d == "math/rand" || d == "math/rand/v2" || d == "C" || d == "unsafe",
					"%s imports %s: the twin has no clock, randomness or cgo", twin[i], d)
			}
		}
		for pkg, deps := range all {
			for _, d := range deps {
				if d == "C" {
					require.Equal(t, module+"/bridge/native", pkg, "only bridge/native may import \"C\"")
				}
				if pkg == module+"/bridge" {
					require.False(t, strings.HasPrefix(d, module+"/scheduler") || strings.HasPrefix(d, module+"/kvpool"),
						"bridge must not know the scheduler or the KV pool (imports %s)", d)
				}
				// The conformance suite is a test helper (it imports
				// testing); go list's Imports leave out _test.go files.
				require.NotEqual(t, module+"/bridge/enginetest", d, "%s imports bridge/enginetest: only tests may", pkg)
				if strings.Contains(d, "go-nvml") {
					require.Equal(t, module+"/cmd/worker", pkg, "only cmd/worker may import go-nvml")
				}
			}
		}
	}
}
