package bridge

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Random123 tests/kat_vectors, the "philox4x32 10" lines: ctr[4] key[2] -> out[4].
func TestPhilox4x32KnownAnswers(t *testing.T) {
	kats := []struct {
		ctr  [4]uint32
		key  [2]uint32
		want [4]uint32
	}{
		{[4]uint32{0, 0, 0, 0}, [2]uint32{0, 0}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff},
			[4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0},
			[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	}
	for _, k := range kats {
		if got := Philox4x32(k.ctr, k.key); got != k.want {
			t.Errorf("Philox4x32(%08x, %08x) = %08x, want %08x", k.ctr, k.key, got, k.want)
		}
	}
	if u := SamplingUniform(0, 0); u != float64(0x6627e8d5>>8)/(1<<24) {
		t.Errorf("SamplingUniform(0, 0) = %v", u)
	}
}

func TestSamplingExp(t *testing.T) {
	worst := 0.0
	for x := -700.0; x <= 0; x += 0.0137 {
		worst = math.Max(worst, math.Abs(samplingExp(x)-math.Exp(x))/math.Exp(x))
	}
	if worst > 1e-14 {
		t.Errorf("relative error %g", worst)
	}
	if samplingExp(0) != 1 || samplingExp(-701) != 0 || samplingExp(math.Inf(-1)) != 0 {
		t.Error("samplingExp edge values")
	}
}

func TestSamplingParamsValidate(t *testing.T) {
	if err := (SamplingParams{}).Validate(); err != nil || !(SamplingParams{}).IsGreedy() {
		t.Fatalf("zero value: %v", err)
	}
	if (SamplingParams{}).NativeTopP() != 1 {
		t.Error("TopP 0 must mean no top-p")
	}
	nan := float32(math.NaN())
	for _, p := range []SamplingParams{{Temperature: -1}, {Temperature: nan}, {Temperature: float32(math.Inf(1))},
		{TopK: -1}, {TopP: -0.1}, {TopP: 1.5}, {TopP: nan}} {
		if p.Validate() == nil {
			t.Errorf("%+v validated", p)
		}
	}
}

func TestSampleProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := range 100 {
		lg := make([]float32, 300)
		for i := range lg {
			lg[i] = float32(rng.NormFloat64() * 3)
		}
		g := Argmax(lg)
		seed := uint64(c)
		if Sample(lg, SamplingParams{TopK: 3, TopP: 0.5, Seed: seed}, 9) != g ||
			Sample(lg, SamplingParams{Temperature: 2, TopK: 1, Seed: seed}, 9) != g ||
			Sample(lg, SamplingParams{Temperature: 2, TopP: 1e-6, Seed: seed}, 9) != g {
			t.Fatalf("case %d: greedy equivalents differ from argmax", c)
		}
	}
	// Frequencies follow the softmax: logits 0, ln 2, ln 4 -> 1/7, 2/7, 4/7.
	lg := []float32{0, float32(math.Log(2)), float32(math.Log(4)), float32(math.Inf(-1))}
	var counts [4]int
	const N = 70000
	for pos := range int64(N) {
		counts[Sample(lg, SamplingParams{Temperature: 1, Seed: 99}, pos)]++
	}
	for i := range 3 {
		want := N * float64(int(1)<<i) / 7
		if math.Abs(float64(counts[i])-want) > 5*math.Sqrt(want) {
			t.Errorf("token %d drawn %d times, want ~%.0f", i, counts[i], want)
		}
	}
	if counts[3] != 0 {
		t.Error("a -Inf logit was drawn")
	}
}
