package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/bridge/native"
)

// The K-quant fixture of scripts/reference/make_kquant_reference.py:
// tensors llama.cpp quantised into Q2_K .. Q6_K, Q5_0, Q5_1 and Q8_0, and a
// Q4_K_M model, with the gguf package's dequantised values.
var kquantFixture = filepath.Join("..", "tests", "testdata", "kquant")

type kquantTensor struct {
	Type   string    `json:"type"`
	Rows   int64     `json:"rows"`
	Cols   int64     `json:"cols"`
	SHA256 string    `json:"sha256"`
	First  []float64 `json:"first"`
}

// TestKQuantDequantization: every tensor of the fixture's two files (one
// tensor of each quantised type llama.cpp wrote, and the whole Q4_K_M
// model) loads with its ggml type and dequantises, row by row through the
// native library (the engines' own conversion), to exactly the float32
// values the gguf package's port of ggml computes: the same sha256 over
// all of them.
func TestKQuantDequantization(t *testing.T) {
	if !haveEngine() {
		t.Skip("built without the native engine (go test -tags native)")
	}
	raw, err := os.ReadFile(filepath.Join(kquantFixture, "kquant.reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Tensors map[string]map[string]kquantTensor `json:"tensors"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for file, tensors := range ref.Tensors {
		infos := ggufTensorBytes(t, filepath.Join(kquantFixture, file))
		for name, want := range tensors {
			got, ok := infos[name]
			if !ok {
				t.Fatalf("%s: tensor %s is missing", file, name)
			}
			if got.dtype.String() != want.Type && !(want.Type == "F32" && got.dtype == bridge.DTypeF32) {
				t.Fatalf("%s %s: type %s, want %s", file, name, got.dtype, want.Type)
			}
			rb, err := got.dtype.RowBytes(want.Cols)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			var first []float32
			for r := int64(0); r < want.Rows; r++ {
				row, err := native.DequantizeRow(got.dtype, got.data[r*rb:(r+1)*rb], want.Cols)
				if err != nil {
					t.Fatalf("%s %s row %d: %v", file, name, r, err)
				}
				for _, v := range row {
					binary.Write(h, binary.LittleEndian, v) //nolint:errcheck // a hash does not fail
				}
				if len(first) < 8 {
					first = append(first, row[:min(len(row), 8-len(first))]...)
				}
			}
			if sum := hex.EncodeToString(h.Sum(nil)); sum != want.SHA256 {
				for i, v := range first {
					if float64(v) != want.First[i] && !(math.IsNaN(float64(v)) && math.IsNaN(want.First[i])) {
						t.Errorf("%s %s: value %d is %v, the gguf package's %v", file, name, i, v, want.First[i])
					}
				}
				t.Fatalf("%s %s (%s, %d x %d): dequantised values differ from the gguf package's", file, name, got.dtype, want.Rows, want.Cols)
			}
			seen[got.dtype.String()] = true
		}
	}
	for _, d := range []string{"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0"} {
		if !seen[d] {
			t.Errorf("no %s tensor in the fixture", d)
		}
	}
	t.Logf("dequantised types, bit for bit as the gguf package: %v", seen)
}

type ggufTensorData struct {
	dtype bridge.DType
	data  []byte
}

// ggufTensorBytes maps each tensor of a GGUF file to its type and bytes.
func ggufTensorBytes(t *testing.T, path string) map[string]ggufTensorData {
	t.Helper()
	gf, err := parseGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ggufTensorData{}
	for _, ti := range gf.TensorInfos {
		dt, ok := ggufTypes[ti.Type]
		if !ok {
			t.Fatalf("%s: tensor %s has type %v", path, ti.Name, ti.Type)
		}
		_, _, start, end, err := tensorSpan(ti, dt, gf.TensorDataStartOffset, 32, int64(len(file)))
		if err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = ggufTensorData{dt, file[start:end]}
	}
	return out
}
