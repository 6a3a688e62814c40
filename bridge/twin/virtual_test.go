package twin_test

import (
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/twin"
)

// TestStepCostWireRoundTrip: the virtual clock's encoding keeps every field
// and FleetStepMS over encoded costs equals the profile's.
func TestStepCostWireRoundTrip(t *testing.T) {
	p, err := twin.BuiltinProfile("h200", "deepseek-v3", twin.Parallelism{EP: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := p.StepCost([]twin.Work{{NewTokens: 512, KVBefore: 8192}, {NewTokens: 1, KVBefore: 100}})
	b := p.StepCost([]twin.Work{{NewTokens: 1, KVBefore: 4096}})
	for _, c := range []twin.StepCost{a, b} {
		got, err := twin.DecodeStepCost(c.AppendBinary(nil))
		if err != nil || got != c {
			t.Fatalf("round trip: %+v, %v; want %+v", got, err, c)
		}
	}
	e, err := twin.New(bridge.Config{Preset: "", NumPages: 16, TokensPerPage: 32}, p)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := e.FleetStepMS([][]byte{a.AppendBinary(nil), b.AppendBinary(nil)})
	if err != nil || ms != p.FleetStepMS([]twin.StepCost{a, b}) {
		t.Fatalf("fleet %v, %v; want %v", ms, err, p.FleetStepMS([]twin.StepCost{a, b}))
	}
	if _, err := e.FleetStepMS([][]byte{{1, 2, 3}}); err == nil {
		t.Fatal("a short record was accepted")
	}
}
