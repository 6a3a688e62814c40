package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/bridge"
	nativeengine "github.com/lockstep-ai/lockstep/bridge/native"
	"github.com/lockstep-ai/lockstep/model"
)

// runInfo is `worker info`: what this build supports.
func runInfo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "describe this checkpoint (GGUF file or Hugging Face directory): architecture, tensors, tokenizer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *modelPath != "" {
		return describeModel(stdout, *modelPath)
	}
	fmt.Fprintf(stdout, "lockstep worker (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(stdout, "engines: fake (pure Go)")
	if b := nativeengine.SupportedBackends(); len(b) > 0 {
		fmt.Fprintf(stdout, ", native: %s", strings.Join(b, ", "))
	} else {
		fmt.Fprintf(stdout, ", native: not built (run make)")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "model presets: %s\n", strings.Join(bridge.PresetNames(), ", "))
	gpuInfo(stdout)
	return nil
}

// describeModel prints what --model PATH would load.
func describeModel(w io.Writer, path string) error {
	m, err := model.Load(path)
	if err != nil {
		return usage.Errorf("--model: %v", err)
	}
	defer m.Close()
	s := m.Shape
	fmt.Fprintf(w, "model %s (%s, %s)\n", m.Name, m.Format, path)
	fmt.Fprintf(w, "  layers %d, hidden %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d\n",
		s.NumLayers, s.HiddenSize, s.NumHeads, s.NumKVHeads, s.HeadDim, s.IntermediateSize, s.VocabSize)
	fmt.Fprintf(w, "  rope theta %g, rms eps %g, tied embeddings %v, context %d\n", s.RopeTheta, s.RMSEps, s.TiedEmbeddings, m.ContextLength)
	if r := s.RopeScaling; r != nil {
		fmt.Fprintf(w, "  rope scaling llama3: factor %g, low %g, high %g, original %d\n", r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalMaxPositions)
	}
	types := map[string]int{}
	for _, t := range m.Tensors {
		types[t.DType.String()]++
	}
	var tl []string
	for k, n := range types {
		tl = append(tl, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(tl)
	fmt.Fprintf(w, "  tensors %d (%s), %.1f MB; KV %d bytes per token in float32\n", len(m.Tensors), strings.Join(tl, ", "),
		float64(m.WeightBytes())/1e6, s.KVBytesPerToken(4))
	tok := m.Tokenizer
	var stops []string
	for _, id := range tok.StopTokens() {
		stops = append(stops, fmt.Sprintf("%d %q", id, tok.TokenText(id)))
	}
	fmt.Fprintf(w, "  tokenizer %d tokens, bos %d, eos %d, add bos %v, stop tokens [%s]\n", tok.VocabSize(), tok.BOS(), tok.EOS(),
		tok.AddBOS(), strings.Join(stops, ", "))
	fmt.Fprintf(w, "  chat template: %v\n", tok.ChatTemplate() != "")
	return nil
}
