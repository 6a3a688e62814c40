package model

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The Gemma fixture of scripts/reference/make_spm_reference.py: a
// SentencePiece BPE trained as Gemma's was (no dummy prefix, byte fallback,
// user-defined <start_of_turn>, <end_of_turn>, <mask>, <unused0> and runs
// of newlines, spaces and tabs), converted as llama.cpp's converter converts
// Gemma (spm-gemma.gguf: add_space_prefix false, the user-defined pieces
// user-defined or control tokens by tokenizer_config.json) and as
// transformers does (hf-gemma: the Hub files' form, a Replace normalizer and
// no pre-tokenizer; hf-gemma-transformers: what transformers 5 writes, with
// a Split pre-tokenizer), with llama.cpp's, sentencepiece's and the
// tokenizers library's ids and texts.
type gemmaReference struct {
	Model    string            `json:"model"`
	HFDirs   []string          `json:"hf_dirs"`
	Tools    map[string]string `json:"tools"`
	Tokenize []struct {
		TextHex        string  `json:"text_hex"`
		AddSpecial     bool    `json:"add_special"`
		ParseSpecial   bool    `json:"parse_special"`
		IDs            []int32 `json:"ids"`
		Decoded        string  `json:"decoded"`
		DecodedSpecial string  `json:"decoded_special"`
		SentencePiece  []int32 `json:"sentencepiece_ids"`
		HF             map[string]struct {
			IDs            []int32 `json:"ids"`
			Decoded        string  `json:"decoded"`
			DecodedSpecial string  `json:"decoded_special"`
		} `json:"hf"`
	} `json:"tokenize"`
	Pieces []struct {
		Plain   string `json:"plain"`
		Special string `json:"special"`
	} `json:"pieces"`
}

func loadGemmaReference(t *testing.T) (gemmaReference, *Tokenizer) {
	t.Helper()
	var ref gemmaReference
	tok := loadTokenizerReference(t, "gemma.reference.json", &ref, &ref.Model)
	return ref, tok
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameIDs(a, b []int32) bool { return slices.Equal(a, b) || len(a) == 0 && len(b) == 0 }

// TestGemmaTokenizerMatchesLlamaCPP: the GGUF form encodes every case
// (leading, trailing and runs of spaces, newlines and tabs cut out as
// user-defined tokens, no space put before the text, German, Japanese,
// emoji through byte fallback, bytes that are not UTF-8, <start_of_turn>
// turns, control tokens with and without parse_special, with and without
// BOS) to llama.cpp's ids, and sentencepiece's where it is comparable;
// decodes them to llama.cpp's text with and without special tokens; and
// every token decodes to llama.cpp's piece.
func TestGemmaTokenizerMatchesLlamaCPP(t *testing.T) {
	ref, tok := loadGemmaReference(t)
	spec := tok.Spec()
	if tok.BOS() != 2 || tok.EOS() != 1 || !tok.AddBOS() || spec.UNK != 3 || spec.PAD != 0 {
		t.Fatalf("BOS %d EOS %d UNK %d PAD %d add BOS %v, want 2, 1, 3, 0, true", tok.BOS(), tok.EOS(), spec.UNK, spec.PAD, tok.AddBOS())
	}
	if spec.SpacePrefix != PrefixNever {
		t.Fatalf("add_space_prefix false read as SpacePrefix %d", spec.SpacePrefix)
	}
	eot, ok := tok.TokenID("<end_of_turn>")
	if !ok || spec.EOT != eot || !slices.Contains(tok.StopTokens(), eot) {
		t.Fatalf("<end_of_turn> %d (%v): EOT %d, stop tokens %v", eot, ok, spec.EOT, tok.StopTokens())
	}
	if id, ok := tok.TokenID("  "); !ok || tok.types[id] != TokenUserDefined {
		t.Fatalf("the two-space user-defined token is not in the vocabulary as the GGUF stores it")
	}
	if len(ref.Tokenize) < 150 {
		t.Fatalf("only %d tokenization cases", len(ref.Tokenize))
	}
	withSP, spDiffer := 0, 0
	for i, c := range ref.Tokenize {
		text := unhex(t, c.TextHex)
		got := tok.Encode(string(text), EncodeOptions{AddSpecial: c.AddSpecial, ParseSpecial: c.ParseSpecial})
		if !sameIDs(got, c.IDs) {
			t.Errorf("case %d %q (add_special %v, parse_special %v): %v, llama.cpp %v", i, text, c.AddSpecial, c.ParseSpecial, got, c.IDs)
			continue
		}
		if c.SentencePiece != nil {
			withSP++
			if !sameIDs(got, c.SentencePiece) {
				// A literal "▁" in the text: sentencepiece cannot tell it
				// from an escaped space, llama.cpp (and the GGUF's
				// user-defined "  ") can.
				if !strings.Contains(string(text), "▁") {
					t.Errorf("case %d %q: %v, sentencepiece %v", i, text, got, c.SentencePiece)
				}
				spDiffer++
			}
		}
		if back, want := tok.Decode(c.IDs), LossyString(unhex(t, c.Decoded)); back != want {
			t.Errorf("case %d %q: decodes to %q, llama.cpp %q", i, text, back, want)
		}
		if back, want := tok.DecodeWith(c.IDs, DecodeOptions{Special: true}), LossyString(unhex(t, c.DecodedSpecial)); back != want {
			t.Errorf("case %d %q: decodes (special) to %q, llama.cpp %q", i, text, back, want)
		}
	}
	if withSP < 20 || spDiffer > 1 {
		t.Errorf("%d cases compared with sentencepiece, %d differ", withSP, spDiffer)
	}
	if len(ref.Pieces) != tok.VocabSize() {
		t.Fatalf("%d pieces for %d tokens", len(ref.Pieces), tok.VocabSize())
	}
	for id, p := range ref.Pieces {
		if got, want := tok.piece(int32(id), false), unhex(t, p.Plain); !bytes.Equal(got, want) {
			t.Errorf("token %d %q: piece %q, llama.cpp %q", id, tok.TokenText(int32(id)), got, want)
		}
		if got, want := tok.TokenBytes(int32(id)), unhex(t, p.Special); !bytes.Equal(got, want) {
			t.Errorf("token %d %q (special): piece %q, llama.cpp %q", id, tok.TokenText(int32(id)), got, want)
		}
	}
	t.Logf("%d tokenization cases (%d also against sentencepiece, %d of them on a literal \"▁\" where sentencepiece differs) and %d pieces agree with llama-cpp-python %s",
		len(ref.Tokenize), withSP, spDiffer, len(ref.Pieces), ref.Tools["llama_cpp_python"])
}

// TestGemmaHFTokenizerMatchesTokenizers: both tokenizer.json forms encode
// every UTF-8 case as the tokenizers library does (with and without BOS;
// without parse_special, special added tokens are text and the others still
// matched, as with encode_special_tokens), decode those ids to its text with
// and without special tokens, and give every token the GGUF's piece.
func TestGemmaHFTokenizerMatchesTokenizers(t *testing.T) {
	ref, gg := loadGemmaReference(t)
	if len(ref.HFDirs) != 2 {
		t.Fatalf("%d tokenizer.json directories in the fixture, want 2", len(ref.HFDirs))
	}
	for _, name := range ref.HFDirs {
		t.Run(name, func(t *testing.T) {
			tok, err := LoadHFTokenizer(filepath.Join(spmFixture, name))
			if err != nil {
				t.Fatal(err)
			}
			spec := tok.Spec()
			if tok.BOS() != 2 || tok.EOS() != 1 || !tok.AddBOS() || spec.SpacePrefix != PrefixNever {
				t.Fatalf("BOS %d EOS %d add BOS %v SpacePrefix %d", tok.BOS(), tok.EOS(), tok.AddBOS(), spec.SpacePrefix)
			}
			n := 0
			for i, c := range ref.Tokenize {
				want, ok := c.HF[name]
				if !ok {
					continue
				}
				n++
				text := unhex(t, c.TextHex)
				got := tok.Encode(string(text), EncodeOptions{AddSpecial: c.AddSpecial, ParseSpecial: c.ParseSpecial})
				if !sameIDs(got, want.IDs) {
					t.Errorf("case %d %q (add_special %v, parse_special %v): %v, tokenizers %v", i, text, c.AddSpecial, c.ParseSpecial, got, want.IDs)
				}
				if back := tok.Decode(want.IDs); back != want.Decoded {
					t.Errorf("case %d %q: decodes to %q, tokenizers %q", i, text, back, want.Decoded)
				}
				if back := tok.DecodeWith(want.IDs, DecodeOptions{Special: true}); back != want.DecodedSpecial {
					t.Errorf("case %d %q: decodes (special) to %q, tokenizers %q", i, text, back, want.DecodedSpecial)
				}
			}
			if n < 140 {
				t.Fatalf("only %d cases", n)
			}
			for id := range ref.Pieces {
				if got, want := tok.TokenBytes(int32(id)), gg.TokenBytes(int32(id)); !bytes.Equal(got, want) {
					t.Errorf("token %d: piece %q, the GGUF's %q", id, got, want)
				}
			}
			t.Logf("%s: %d cases agree with tokenizers %s", name, n, ref.Tools["tokenizers"])
		})
	}
}

// TestGemmaHFFormsRead: a Split at " " is read as the no-op it is only after
// a normalizer that turns every space into "▁", and a byte-fallback
// decoder must turn "▁" back into spaces.
func TestGemmaHFFormsRead(t *testing.T) {
	src := filepath.Join(spmFixture, "hf-gemma")
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	load := func(mutate func(tj map[string]any)) (*Tokenizer, error) {
		var tj map[string]any
		if err := json.Unmarshal(raw, &tj); err != nil {
			t.Fatal(err)
		}
		mutate(tj)
		b, err := json.Marshal(tj)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, data := range map[string][]byte{"tokenizer.json": b, "tokenizer_config.json": cfg} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return LoadHFTokenizer(dir)
	}
	split := func(pattern map[string]any, invert bool) map[string]any {
		return map[string]any{"type": "Split", "pattern": pattern, "behavior": "Isolated", "invert": invert}
	}
	hub, err := load(func(map[string]any) {})
	if err != nil {
		t.Fatal(err)
	}
	withSplit, err := load(func(tj map[string]any) { tj["pre_tokenizer"] = split(map[string]any{"String": " "}, false) })
	if err != nil {
		t.Fatal(err)
	}
	text := "  Hello  world\n\n <start_of_turn>x   y 🦙"
	opts := EncodeOptions{AddSpecial: true, ParseSpecial: true}
	if a, b := hub.Encode(text, opts), withSplit.Encode(text, opts); !slices.Equal(a, b) {
		t.Fatalf("a Split at \" \" changed the ids: %v, %v", a, b)
	}
	for _, c := range []struct {
		name   string
		mutate func(tj map[string]any)
		want   string
	}{
		{"split without replace", func(tj map[string]any) {
			tj["normalizer"] = nil
			tj["pre_tokenizer"] = split(map[string]any{"String": " "}, false)
		}, "pre_tokenizer Split"},
		{"inverted split", func(tj map[string]any) { tj["pre_tokenizer"] = split(map[string]any{"String": " "}, true) }, "pre_tokenizer Split"},
		{"regex split", func(tj map[string]any) { tj["pre_tokenizer"] = split(map[string]any{"Regex": " "}, false) }, "pre_tokenizer Split"},
		{"no replace", func(tj map[string]any) { tj["normalizer"] = nil }, "byte_fallback without"},
		{"decoder keeps ▁", func(tj map[string]any) {
			tj["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}}}
		}, "back into spaces"},
	} {
		if _, err := load(c.mutate); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to mention %q", c.name, err, c.want)
		}
	}
}
