package tests

import (
	"os/exec"
	"slices"
	"sort"
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

// closure is every package pkg imports, directly or not (the module's
// packages and the standard library's names as they appear in all).
func closure(all map[string][]string, pkg string) []string {
	seen := map[string]bool{}
	var walk func(p string)
	walk = func(p string) {
		for _, d := range all[p] {
			if !seen[d] {
				seen[d] = true
				walk(d)
			}
		}
	}
	walk(pkg)
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// missingPackages are the packages of rel the module does not have.
func missingPackages(all map[string][]string, rel ...string) []string {
	var out []string
	for _, p := range rel {
		if _, ok := all[module+"/"+p]; !ok {
			out = append(out, p)
		}
	}
	return out
}

// requirePackages fails when a rule names a package the module does not
// have: a misspelt rule must not pass by checking nothing.
func requirePackages(t *testing.T, all map[string][]string, rel ...string) {
	t.Helper()
	require.Empty(t, missingPackages(all, rel...), "a dependency rule names packages the module does not have (misspelt, or moved?)")
}

// The rules of DESIGN.md §1.
var (
	// pure packages: the standard library and each other only, and none of
	// the standard library's I/O, clock, randomness, goroutines or cgo.
	purePackages = []string{"scheduler", "scheduler/router", "scheduler/costfit", "scheduler/sim", "kvpool"}
	// core packages never depend, even indirectly, on the front ends.
	corePackages = []string{"scheduler", "scheduler/router", "scheduler/costfit", "scheduler/sim", "kvpool",
		"executor", "structured", "bridge", "bridge/fake", "bridge/twin", "bridge/native", "bridge/internal/goengine"}
	frontEnds = []string{"model", "serve", "fleet", "report", "eval", "cmd"}
)

// TestDependencyRules enforces DESIGN.md §1.
func TestDependencyRules(t *testing.T) {
	for _, tags := range []string{"", "native"} {
		all := imports(t, tags)
		requirePackages(t, all, purePackages...)
		requirePackages(t, all, corePackages...)
		requirePackages(t, all, frontEnds[:len(frontEnds)-1]...) // cmd has no package of its own
		requirePure(t, all)
		requireCoreWithoutFrontEnds(t, all)
		requireTwinAlone(t, all)
		for pkg, deps := range all {
			for _, d := range deps {
				if d == "C" {
					require.Equal(t, module+"/bridge/native", pkg, "only bridge/native may import \"C\"")
				}
				if pkg == module+"/bridge" {
					require.False(t, strings.HasPrefix(d, module+"/scheduler") || strings.HasPrefix(d, module+"/kvpool"),
						"bridge must not know the scheduler or the KV pool (imports %s)", d)
				}
				if strings.Contains(d, "go-nvml") {
					require.Equal(t, module+"/cmd/worker", pkg, "only cmd/worker may import go-nvml")
				}
				require.False(t, strings.HasPrefix(d, module+"/cmd/"), "%s imports %s: no package imports a command", pkg, d)
				// The conformance suite is a test helper (it imports
				// testing); go list's Imports leave out _test.go files.
				require.NotEqual(t, module+"/bridge/enginetest", d, "%s imports bridge/enginetest: only tests may", pkg)
			}
		}
	}
}

// requirePure: the scheduling core has no I/O, clock, randomness,
// goroutines or cgo, and imports only the other pure packages.
func requirePure(t *testing.T, all map[string][]string) {
	t.Helper()
	forbidden := map[string]bool{"time": true, "math/rand": true, "math/rand/v2": true, "os": true,
		"net": true, "sync": true, "io": true, "C": true, "unsafe": true, "runtime": true}
	// costfit's Result.Format writes to a caller's io.Writer: the
	// interface only, the package itself opens nothing.
	allowed := map[string]map[string]bool{"scheduler/costfit": {"io": true}}
	for _, p := range purePackages {
		for _, d := range all[module+"/"+p] {
			if strings.HasPrefix(d, module+"/") {
				rel := strings.TrimPrefix(d, module+"/")
				require.Contains(t, purePackages, rel, "%s may import only the other pure packages, imports %s", p, d)
				continue
			}
			require.NotContains(t, d, ".", "%s imports a non-standard package %s", p, d)
			require.False(t, forbidden[d] && !allowed[p][d], "%s imports %s: the scheduling core has no I/O, clock, randomness, goroutines or cgo", p, d)
		}
	}
}

// requireCoreWithoutFrontEnds: the core (scheduler, kvpool, executor,
// bridge) never depends on the model loader, the server, the fleet, the
// reports, the evaluation or a command, even through another package.
func requireCoreWithoutFrontEnds(t *testing.T, all map[string][]string) {
	t.Helper()
	for _, p := range corePackages {
		for _, d := range closure(all, module+"/"+p) {
			rel, ok := strings.CutPrefix(d, module+"/")
			if !ok {
				continue
			}
			top, _, _ := strings.Cut(rel, "/")
			require.False(t, slices.Contains(frontEnds, top), "%s depends on %s (through %v): the core never imports %v",
				p, rel, path(all, module+"/"+p, d), frontEnds)
		}
	}
}

// path is an import chain from a to b, for messages.
func path(all map[string][]string, a, b string) []string {
	prev := map[string]string{a: ""}
	queue := []string{a}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == b {
			var chain []string
			for q := b; q != ""; q = prev[q] {
				chain = append([]string{strings.TrimPrefix(q, module+"/")}, chain...)
			}
			return chain
		}
		for _, d := range all[p] {
			if _, seen := prev[d]; !seen {
				prev[d] = p
				queue = append(queue, d)
			}
		}
	}
	return nil
}

// requireTwinAlone: the twin engine is the standard library, bridge and
// bridge's internal packages only (the code it shares with the fake), and
// has no clock or randomness (its time is modelled, its tokens a hash),
// neither in the twin nor in the internal packages it imports.
func requireTwinAlone(t *testing.T, all map[string][]string) {
	t.Helper()
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
}

// TestDependencyRuleHelpers: the rules catch what they are for (a rule
// naming no package, an indirect dependency of the core on a front end),
// on a made-up import graph.
func TestDependencyRuleHelpers(t *testing.T) {
	all := map[string][]string{
		module + "/executor": {module + "/workload", "fmt"},
		module + "/workload": {module + "/model"},
		module + "/model":    {"os"},
	}
	require.Equal(t, []string{"fmt", module + "/model", module + "/workload", "os"}, closure(all, module+"/executor"))
	require.Equal(t, []string{"executor", "workload", "model"}, path(all, module+"/executor", module+"/model"))
	require.Equal(t, []string{"schedular"}, missingPackages(all, "executor", "schedular"), "a misspelt package in a rule is caught")
}
