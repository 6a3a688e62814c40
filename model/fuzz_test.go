package model

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockstep-ai/lockstep/model/modeltest"
)

// FuzzGGUF: any file (a real GGUF's header with bytes changed or cut off,
// a tiny model's whole file) loads or is refused with an error; the loader
// never panics (issue 23).
func FuzzGGUF(f *testing.F) {
	tiny, err := os.ReadFile(writeGGUF(f, newTinyModel(3, false), ggufOptions{}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny)
	f.Add(tiny[:len(tiny)/2])
	if real, err := os.Open(filepath.Join(modeltest.CacheDir(), modeltest.SmolLM2Name)); err == nil {
		head := make([]byte, 2<<20) // the header and metadata: tokens, merges, template
		n, _ := io.ReadFull(real, head)
		real.Close()
		f.Add(head[:n])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := Load(path); err == nil {
			m.Close()
		}
		if tok, err := LoadGGUFTokenizer(path); err == nil {
			tok.Decode(tok.Encode("Hello, world! 123", EncodeOptions{AddSpecial: true}))
		}
	})
}

// FuzzHFTokenizer: any tokenizer.json is refused with an error or yields
// a tokenizer that encodes and decodes; nothing panics or sizes a table by
// an id it read.
func FuzzHFTokenizer(f *testing.F) {
	seed, err := os.ReadFile(filepath.Join(hfDir(f, nil), "tokenizer.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"zz":1000000000},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tok, err := LoadHFTokenizer(dir)
		if err != nil {
			return
		}
		tok.Decode(tok.Encode("hello <|end|> world", EncodeOptions{AddSpecial: true, ParseSpecial: true}))
	})
}
