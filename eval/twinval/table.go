// Package twinval checks the digital twin (bridge/twin) against published
// GPU figures nobody here measured: TensorRT-LLM's throughput tables,
// published single-stream latencies, and operator profiles (Vidur's GEMMs,
// norms and all-reduces on H100, DeepGEMM's FP8 GEMMs, a paged decode
// attention table). Each table is kept in published/ with its source,
// version and configuration; Validate runs the twin on every row (the
// end-to-end rows through the production fleet: scheduler, executor, KV
// pool) and reports twin/published per row and the mean absolute error per
// group; Fit recomputes the coefficients the twin fits to those tables
// (`worker twin-validate`, docs/twin.md).
package twinval

import (
	"bufio"
	"embed"
	"fmt"
	"strconv"
	"strings"
)

//go:embed published/*.csv
var published embed.FS

// table is one published CSV: the comment lines at its top (its source,
// version and configuration) and its rows by column name.
type table struct {
	name   string
	source []string
	cols   []string
	rows   [][]string
}

// readTable parses published/name: '#' lines first, then a header and rows.
func readTable(name string) (*table, error) {
	f, err := published.Open("published/" + name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t := &table{name: name}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		switch {
		case text == "":
		case strings.HasPrefix(text, "#"):
			if t.cols != nil {
				return nil, fmt.Errorf("%s:%d: a comment after the header", name, line)
			}
			t.source = append(t.source, strings.TrimSpace(strings.TrimPrefix(text, "#")))
		case t.cols == nil:
			t.cols = strings.Split(text, ",")
		default:
			f := strings.Split(text, ",")
			if len(f) != len(t.cols) {
				return nil, fmt.Errorf("%s:%d: %d fields, the header has %d", name, line, len(f), len(t.cols))
			}
			t.rows = append(t.rows, f)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(t.rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", name)
	}
	return t, nil
}

// row reads one row's fields by name, remembering the first error.
type row struct {
	t   *table
	i   int
	err error
}

func (t *table) row(i int) *row { return &row{t: t, i: i} }

func (r *row) str(col string) string {
	for j, c := range r.t.cols {
		if c == col {
			return r.t.rows[r.i][j]
		}
	}
	if r.err == nil {
		r.err = fmt.Errorf("%s: no column %q", r.t.name, col)
	}
	return ""
}

func (r *row) num(col string) float64 {
	s := r.str(col)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("%s row %d: %s %q is not a number", r.t.name, r.i+1, col, s)
	}
	return v
}

func (r *row) int(col string) int { return int(r.num(col)) }

// Sources are the source lines of every published table, by file name.
func Sources() (map[string][]string, error) {
	out := map[string][]string{}
	for _, n := range tableNames {
		t, err := readTable(n)
		if err != nil {
			return nil, err
		}
		out[n] = t.source
	}
	return out, nil
}

// The published tables (published/*.csv).
const (
	fileTRTLLM    = "trtllm-1.0-throughput.csv"
	fileLatency   = "latency.csv"
	fileVidurMLP  = "vidur-h100-mlp.csv"
	fileVidurAR   = "vidur-h100-allreduce.csv"
	fileDeepGEMM  = "deepgemm-h800-fp8.csv"
	fileORTDecode = "ort-h100-decode.csv"

	fileVLLMNVFP4    = "vllm-b200-nvfp4.csv"
	fileTorchAONVFP4 = "torchao-b200-nvfp4.csv"
)

var tableNames = []string{fileTRTLLM, fileLatency, fileVidurMLP, fileVidurAR, fileDeepGEMM, fileVLLMNVFP4, fileTorchAONVFP4,
	fileORTDecode}
