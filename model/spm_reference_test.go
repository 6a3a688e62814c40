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
	"unicode/utf8"
)

// The SentencePiece fixture of scripts/reference/make_spm_reference.py: a
// vocabulary trained the way Llama 2's was, converted as llama.cpp's
// converter does, with llama.cpp's tokenization and pieces.
var spmFixture = filepath.Join("..", "tests", "testdata", "spm")

type spmReference struct {
	Model    string            `json:"model"`
	Tools    map[string]string `json:"tools"`
	Tokenize []struct {
		TextHex       string  `json:"text_hex"`
		AddSpecial    bool    `json:"add_special"`
		ParseSpecial  bool    `json:"parse_special"`
		IDs           []int32 `json:"ids"`
		SentencePiece []int32 `json:"sentencepiece_ids"`
	} `json:"tokenize"`
	HF     map[string][][]int32 `json:"hf"`
	Pieces []struct {
		Plain   string `json:"plain"`
		Special string `json:"special"`
	} `json:"pieces"`
}

func loadSPMReference(t *testing.T) (spmReference, *Tokenizer) {
	t.Helper()
	var ref spmReference
	tok := loadTokenizerReference(t, "spm.reference.json", &ref, &ref.Model)
	return ref, tok
}

// loadTokenizerReference reads the reference JSON name of spmFixture into
// ref and loads the GGUF tokenizer it names (*model, a field of ref).
func loadTokenizerReference(t *testing.T, name string, ref any, model *string) *Tokenizer {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(spmFixture, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, ref); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadGGUFTokenizer(filepath.Join(spmFixture, *model))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestSPMTokenizerMatchesLlamaCPP: every case of the fixture (plain text,
// runs of spaces, newlines and tabs, digits, German, Japanese and emoji
// through byte fallback, bytes that are not UTF-8, control and user-defined
// tokens with and without parse_special, with and without BOS) encodes to
// llama.cpp's ids, which equal sentencepiece's own on the plain texts; every
// token decodes to llama.cpp's piece, with and without special tokens; and
// decoding an encoding of UTF-8 gives the text back (the space put before
// it aside).
func TestSPMTokenizerMatchesLlamaCPP(t *testing.T) {
	ref, tok := loadSPMReference(t)
	if tok.BOS() != 1 || tok.EOS() != 2 || !tok.AddBOS() {
		t.Fatalf("BOS %d EOS %d add BOS %v, want 1, 2, true", tok.BOS(), tok.EOS(), tok.AddBOS())
	}
	if len(ref.Tokenize) < 90 {
		t.Fatalf("only %d tokenization cases", len(ref.Tokenize))
	}
	withSP := 0
	for i, c := range ref.Tokenize {
		text, err := hex.DecodeString(c.TextHex)
		if err != nil {
			t.Fatal(err)
		}
		got := tok.Encode(string(text), EncodeOptions{AddSpecial: c.AddSpecial, ParseSpecial: c.ParseSpecial})
		if !slices.Equal(got, c.IDs) && !(len(got) == 0 && len(c.IDs) == 0) {
			t.Fatalf("case %d %q (add_special %v, parse_special %v): %v, llama.cpp %v", i, text, c.AddSpecial, c.ParseSpecial, got, c.IDs)
		}
		if c.SentencePiece != nil {
			withSP++
			if !slices.Equal(c.SentencePiece, c.IDs) {
				t.Fatalf("case %d %q: the fixture's llama.cpp and sentencepiece ids differ", i, text)
			}
		}
		// (A user-defined token is matched in any text, and a space is put
		// after it too.)
		// (Bytes that are not UTF-8 can swallow the bytes of a following "▁",
		// in llama.cpp too: such texts do not come back.)
		if !c.AddSpecial && !c.ParseSpecial && len(text) > 0 && !bytes.Contains(text, []byte("<|tool|>")) && utf8.Valid(text) {
			if back := tok.DecodeWith(got, DecodeOptions{Special: true}); back != " "+LossyString(text) {
				t.Fatalf("case %d: %q decodes to %q", i, text, back)
			}
		}
	}
	if withSP < 10 {
		t.Fatalf("only %d cases compared with sentencepiece", withSP)
	}
	if len(ref.Pieces) != tok.VocabSize() {
		t.Fatalf("%d pieces for %d tokens", len(ref.Pieces), tok.VocabSize())
	}
	for id, p := range ref.Pieces {
		for _, special := range []bool{false, true} {
			want, _ := hex.DecodeString(map[bool]string{false: p.Plain, true: p.Special}[special])
			var got []byte
			if special {
				got = tok.TokenBytes(int32(id))
			} else {
				got = tok.piece(int32(id), false)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("token %d %q (special %v): piece %q, llama.cpp %q", id, tok.TokenText(int32(id)), special, got, want)
			}
		}
	}
	t.Logf("%d tokenization cases (%d also against sentencepiece) and %d pieces agree with llama-cpp-python %s",
		len(ref.Tokenize), withSP, len(ref.Pieces), ref.Tools["llama_cpp_python"])
}

// TestSPMHFTokenizerMatchesTokenizers: the same vocabulary as Hugging Face
// tokenizer.json files (a BPE with byte_fallback) in Llama 2's form (a
// Prepend + Replace normalizer), Mistral's (Metaspace, prepend_scheme
// first) and a Metaspace that splits words encodes every UTF-8 case as the
// tokenizers library does (added tokens parsed, with and without BOS), and
// decodes every token to llama.cpp's piece.
func TestSPMHFTokenizerMatchesTokenizers(t *testing.T) {
	ref, gg := loadSPMReference(t)
	if len(ref.HF) != 3 {
		t.Fatalf("%d tokenizer.json variants in the fixture, want 3", len(ref.HF))
	}
	for name, ids := range ref.HF {
		t.Run(name, func(t *testing.T) {
			tok, err := LoadHFTokenizer(filepath.Join(spmFixture, name))
			if err != nil {
				t.Fatal(err)
			}
			if tok.BOS() != 1 || !tok.AddBOS() {
				t.Fatalf("BOS %d, add BOS %v", tok.BOS(), tok.AddBOS())
			}
			n := 0
			for i, c := range ref.Tokenize {
				if ids[i] == nil {
					continue
				}
				text, _ := hex.DecodeString(c.TextHex)
				got := tok.Encode(string(text), EncodeOptions{AddSpecial: c.AddSpecial, ParseSpecial: true})
				if !slices.Equal(got, ids[i]) && !(len(got) == 0 && len(ids[i]) == 0) {
					t.Fatalf("case %d %q (add_special %v): %v, tokenizers %v", i, text, c.AddSpecial, got, ids[i])
				}
				n++
			}
			if n < 40 {
				t.Fatalf("only %d cases", n)
			}
			for id := range ref.Pieces {
				if got, want := tok.TokenBytes(int32(id)), gg.TokenBytes(int32(id)); !bytes.Equal(got, want) {
					t.Fatalf("token %d: piece %q, the GGUF's %q", id, got, want)
				}
			}
			t.Logf("%s: %d cases agree with tokenizers %s", name, n, ref.Tools["tokenizers"])
		})
	}
}

// BenchmarkSPMEncode: SentencePiece encoding of the text BenchmarkSmolEncode
// encodes (make bench), with the fixture's 1 001-piece vocabulary; the
// whole text is one run of symbols (no pre-tokeniser, no cache).
func BenchmarkSPMEncode(b *testing.B) {
	tok, err := LoadGGUFTokenizer(filepath.Join(spmFixture, "spm-llama.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox, 12345 times: café 東京 😀\n\tdef f(x): return x\n", 200)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, EncodeOptions{})
	}
}
