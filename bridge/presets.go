package bridge

import (
	"fmt"
	"sort"
	"strings"
)

// Presets are the model shapes known by name. They must equal the native
// presets (native/src/presets.cpp); bridge/native tests compare the two.
var Presets = map[string]ModelShape{
	// tiny: fast on the CPU engine; GQA 2:1.
	"tiny": {NumLayers: 2, HiddenSize: 64, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		IntermediateSize: 128, VocabSize: 512, RopeTheta: 10000, RMSEps: 1e-5},
	// llama-8b: Llama 3 8B shape (GQA 4:1).
	"llama-8b": {NumLayers: 32, HiddenSize: 4096, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 14336, VocabSize: 128256, RopeTheta: 500000, RMSEps: 1e-5},
	// llama-70b: Llama 3 70B shape (GQA 8:1).
	"llama-70b": {NumLayers: 80, HiddenSize: 8192, NumHeads: 64, NumKVHeads: 8, HeadDim: 128,
		IntermediateSize: 28672, VocabSize: 128256, RopeTheta: 500000, RMSEps: 1e-5},
}

// PresetNames lists the preset names in sorted order.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupPreset returns a preset's shape or an error listing the allowed names.
func LookupPreset(name string) (ModelShape, error) {
	s, ok := Presets[name]
	if !ok {
		return ModelShape{}, fmt.Errorf("unknown model preset %q (allowed: %s)", name, strings.Join(PresetNames(), ", "))
	}
	return s, nil
}

// Validate checks a shape's internal consistency; the error names the field.
func (s ModelShape) Validate() error {
	switch {
	case s.NumLayers <= 0:
		return fmt.Errorf("model shape: num_layers must be positive, got %d", s.NumLayers)
	case s.NumHeads <= 0:
		return fmt.Errorf("model shape: num_heads must be positive, got %d", s.NumHeads)
	case s.NumKVHeads <= 0 || s.NumHeads%s.NumKVHeads != 0:
		return fmt.Errorf("model shape: num_kv_heads must be positive and divide num_heads (%d), got %d", s.NumHeads, s.NumKVHeads)
	case s.HeadDim <= 0 || s.HeadDim%2 != 0:
		return fmt.Errorf("model shape: head_dim must be positive and even, got %d", s.HeadDim)
	case s.HiddenSize != s.NumHeads*s.HeadDim:
		return fmt.Errorf("model shape: hidden_size must equal num_heads*head_dim (%d), got %d", s.NumHeads*s.HeadDim, s.HiddenSize)
	case s.IntermediateSize <= 0:
		return fmt.Errorf("model shape: intermediate_size must be positive, got %d", s.IntermediateSize)
	case s.VocabSize <= 1:
		return fmt.Errorf("model shape: vocab_size must be at least 2, got %d", s.VocabSize)
	case !(s.RopeTheta > 0):
		return fmt.Errorf("model shape: rope_theta must be positive, got %g", s.RopeTheta)
	case !(s.RMSEps > 0):
		return fmt.Errorf("model shape: rms_eps must be positive, got %g", s.RMSEps)
	}
	if r := s.RopeScaling; r != nil {
		switch {
		case !(r.Factor > 1):
			return fmt.Errorf("model shape: rope_scaling factor must be > 1, got %g", r.Factor)
		case !(r.LowFreqFactor >= 1):
			return fmt.Errorf("model shape: rope_scaling low_freq_factor must be >= 1, got %g", r.LowFreqFactor)
		case !(r.HighFreqFactor > r.LowFreqFactor):
			return fmt.Errorf("model shape: rope_scaling high_freq_factor must exceed low_freq_factor (%g), got %g", r.LowFreqFactor, r.HighFreqFactor)
		case r.OriginalMaxPositions <= 0:
			return fmt.Errorf("model shape: rope_scaling original_max_position_embeddings must be positive, got %d", r.OriginalMaxPositions)
		}
	}
	return nil
}
