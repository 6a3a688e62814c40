//go:build native

package native

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-ai/lockstep/bridge"
)

// TestMoEShapeValidationMatchesNative: every MoE shape rule fails the same
// way in bridge.ModelShape.Validate and in the native library.
func TestMoEShapeValidationMatchesNative(t *testing.T) {
	base := bridge.Presets["moe-tiny"]
	for _, c := range []struct {
		name   string
		mutate func(s *bridge.ModelShape)
	}{
		{"negative experts", func(s *bridge.ModelShape) { s.NumExperts = -1 }},
		{"dense with MoE fields", func(s *bridge.ModelShape) { s.NumExperts = 0 }},
		{"top-k zero", func(s *bridge.ModelShape) { s.NumExpertsPerTok = 0 }},
		{"top-k above experts", func(s *bridge.ModelShape) { s.NumExpertsPerTok = 17 }},
		{"no expert width", func(s *bridge.ModelShape) { s.MoEIntermediateSize = 0 }},
		{"negative shared", func(s *bridge.ModelShape) { s.NumSharedExperts = -1 }},
		{"unknown router", func(s *bridge.ModelShape) { s.RouterNorm = 5 }},
		{"dense layers past the end", func(s *bridge.ModelShape) { s.FirstDenseLayers = s.NumLayers }},
		{"groups not dividing", func(s *bridge.ModelShape) { s.ExpertGroups, s.ExpertGroupsUsed = 3, 1 }},
		{"mla head_dim", func(s *bridge.ModelShape) {
			s.NumKVHeads, s.KVLoraRank, s.QKNopeHeadDim, s.QKRopeHeadDim, s.VHeadDim = s.NumHeads, 8, 8, 6, 8
		}},
		{"yarn without mla", func(s *bridge.ModelShape) {
			s.Yarn = &bridge.YarnScaling{Factor: 4, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1}
		}},
		{"hidden not positive", func(s *bridge.ModelShape) { s.HiddenSize = 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := base
			c.mutate(&s)
			goErr := s.Validate()
			if goErr == nil {
				t.Fatal("Validate accepted the shape")
			}
			_, err := Open(bridge.Config{Shape: s, NumPages: 4, TokensPerPage: 4, ValidateOnly: true})
			if !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), goErr.Error()) {
				t.Errorf("native: %v\nGo:     %v", err, goErr)
			}
		})
	}
	for _, name := range []string{"moe-tiny", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-tiny", "deepseek-v3", "kimi-k2"} {
		s := bridge.Presets[name]
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		eng, err := Open(bridge.Config{Preset: name, NumPages: 16, TokensPerPage: 16, ValidateOnly: true})
		if err != nil {
			t.Errorf("%s validate_only: %v", name, err)
			continue
		}
		eng.Close()
	}
}

// TestExpertMember: two EP members (one engine each, in-process group) run
// different sequences concurrently and sample what one engine with every
// expert samples for each; the membership is validated.
func TestExpertMember(t *testing.T) {
	shape := bridge.Presets["moe-tiny"]
	seqs := []bridge.SeqStep{
		{Tokens: prompt(1, 21, shape.VocabSize), BlockTable: pageRange(0, 2), Sample: true},
		{Tokens: prompt(2, 9, shape.VocabSize), BlockTable: pageRange(2, 1), Sample: true},
	}
	one, err := Open(bridge.Config{Preset: "moe-tiny", NumPages: 8, TokensPerPage: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	var want bridge.StepResult
	if err := one.Step(&bridge.StepDesc{Seqs: seqs}, &want); err != nil {
		t.Fatal(err)
	}
	if want.MoEWaitMS != 0 {
		t.Errorf("one engine without EP waited %v ms in MoE exchanges", want.MoEWaitMS)
	}
	g, err := NewCPGroup(2, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := Open(bridge.Config{Preset: "moe-tiny", NumPages: 8, TokensPerPage: 16,
		Expert: &bridge.ExpertMember{Group: g, Rank: 0, Size: 3}}); err == nil || !strings.Contains(err.Error(), "Config.Expert.Size 3") {
		t.Errorf("size mismatch: err = %v", err)
	}
	if _, err := Open(bridge.Config{Preset: "tiny", NumPages: 8, TokensPerPage: 16,
		Expert: &bridge.ExpertMember{Group: g, Rank: 0, Size: 2}}); !errors.Is(err, bridge.ErrInvalidArgument) || !strings.Contains(err.Error(), "dense") {
		t.Errorf("dense model: err = %v", err)
	}
	got := make([]bridge.StepResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		eng, err := Open(bridge.Config{Preset: "moe-tiny", NumPages: 8, TokensPerPage: 16,
			Expert: &bridge.ExpertMember{Group: g, Rank: r, Size: 2}})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = eng.Step(&bridge.StepDesc{Seqs: seqs[r : r+1]}, &got[r])
		}()
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("member %d: %v", r, errs[r])
		}
		if got[r].Sampled[0] != want.Sampled[r] {
			t.Errorf("member %d sampled %d, one engine %d", r, got[r].Sampled[0], want.Sampled[r])
		}
		if got[r].MoEWaitMS <= 0 || got[r].MoEWaitMS > got[r].DeviceMS {
			t.Errorf("member %d: moe wait %v ms of a %v ms step", r, got[r].MoEWaitMS, got[r].DeviceMS)
		}
	}
}
