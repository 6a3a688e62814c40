package model

import (
	"bufio"
	"encoding/json"
	"github.com/lockstep-ai/lockstep/model/modeltest"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

var (
	smolOnce sync.Once
	smolTok  *Tokenizer
	smolErr  error
)

// smol loads the SmolLM2 tokenizer once, skipping when the model is absent.
func smol(t testing.TB) *Tokenizer {
	t.Helper()
	path := modeltest.SmolLM2(t)
	smolOnce.Do(func() { smolTok, smolErr = LoadGGUFTokenizer(path) })
	if smolErr != nil {
		t.Fatal(smolErr)
	}
	return smolTok
}

type tokCase struct {
	Text         string  `json:"text"`
	IDs          []int32 `json:"ids"`
	ParseSpecial bool    `json:"parse_special"`
}

func readJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSmolSpec(t *testing.T) {
	tok := smol(t)
	sp := tok.Spec()
	if sp.Pre != "smollm" || tok.VocabSize() != 49152 || len(sp.Merges) != 48900 {
		t.Fatalf("pre %q vocab %d merges %d", sp.Pre, tok.VocabSize(), len(sp.Merges))
	}
	if tok.BOS() != 1 || tok.EOS() != 2 || sp.UNK != 0 || sp.PAD != 2 || sp.EOT != -1 || tok.AddBOS() || sp.AddEOS {
		t.Fatalf("special ids: %+v", sp)
	}
	if got := tok.StopTokens(); !slices.Equal(got, []int32{0, 2}) {
		t.Fatalf("stop tokens %v", got)
	}
	if tok.TokenText(1) != "<|im_start|>" || tok.TokenText(-1) != "" || tok.TokenText(1<<20) != "" {
		t.Fatal("TokenText")
	}
	if !strings.Contains(tok.ChatTemplate(), "<|im_start|>") {
		t.Fatal("chat template missing")
	}
}

func TestSmolFixture(t *testing.T) {
	tok := smol(t)
	cases := readJSONL[tokCase](t, "testdata/smollm2/tokenizer_cases.jsonl")
	if len(cases) < 1000 {
		t.Fatalf("only %d fixture cases", len(cases))
	}
	fails := 0
	for _, c := range cases {
		got := tok.Encode(c.Text, EncodeOptions{ParseSpecial: c.ParseSpecial})
		if !slices.Equal(got, c.IDs) {
			fails++
			if fails <= 10 {
				t.Errorf("Encode(%q):\n got %v\nwant %v", c.Text, got, c.IDs)
			}
			continue
		}
		opts := DecodeOptions{Special: c.ParseSpecial}
		if d := tok.DecodeWith(got, opts); d != c.Text {
			t.Errorf("Decode(Encode(%q)) = %q", c.Text, d)
		}
		st := tok.NewStreamWith(opts)
		var sb strings.Builder
		for _, id := range got {
			s := st.Next(id)
			if !utf8.ValidString(s) {
				t.Errorf("%q: stream piece %q is not valid UTF-8", c.Text, s)
			}
			sb.WriteString(s)
		}
		sb.WriteString(st.Flush())
		if sb.String() != c.Text {
			t.Errorf("stream decode of %q = %q", c.Text, sb.String())
		}
	}
	if fails > 0 {
		t.Errorf("%d of %d fixture cases differ", fails, len(cases))
	}
	t.Logf("%d fixture cases", len(cases))
}

func TestSmolSpecialTokens(t *testing.T) {
	tok := smol(t)
	text := "<|im_start|>user\nHi<|im_end|>"
	with := tok.Encode(text, EncodeOptions{ParseSpecial: true})
	if with[0] != 1 || with[len(with)-1] != 2 {
		t.Fatalf("ParseSpecial: %v", with)
	}
	without := tok.Encode(text, EncodeOptions{})
	if slices.Contains(without, 1) || slices.Contains(without, 2) {
		t.Fatalf("special tokens matched without ParseSpecial: %v", without)
	}
	if d := tok.Decode(without); d != text {
		t.Fatalf("decode %q", d)
	}
	// control tokens are skipped by default, rendered on request
	if d := tok.Decode(with); d != "user\nHi" {
		t.Fatalf("Decode = %q", d)
	}
	if d := tok.DecodeWith(with, DecodeOptions{Special: true}); d != text {
		t.Fatalf("DecodeWith = %q", d)
	}
	// add_bos_token is false for SmolLM2: AddSpecial adds nothing
	if got := tok.Encode("Hi", EncodeOptions{AddSpecial: true}); len(got) != 1 {
		t.Fatalf("AddSpecial: %v", got)
	}
}

type chatCase struct {
	Messages            []ChatMessage `json:"messages"`
	AddGenerationPrompt bool          `json:"add_generation_prompt"`
	Text                string        `json:"text"`
	IDs                 []int32       `json:"ids"`
}

func TestSmolChatTemplate(t *testing.T) {
	tok := smol(t)
	cases := readJSONL[chatCase](t, "testdata/smollm2/chat_cases.jsonl")
	for i, c := range cases {
		got, err := RenderChat(tok.ChatTemplate(), c.Messages, c.AddGenerationPrompt, tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if got != c.Text {
			t.Errorf("case %d: render\n got %q\nwant %q", i, got, c.Text)
		}
		if ids := tok.Encode(got, EncodeOptions{ParseSpecial: true}); !slices.Equal(ids, c.IDs) {
			t.Errorf("case %d: ids\n got %v\nwant %v", i, ids, c.IDs)
		}
	}
}

// TestStreamEmojiAcrossTokens: a character split over tokens comes out once, whole.
func TestSmolStreamSplitCharacter(t *testing.T) {
	tok := smol(t)
	for _, s := range []string{"😀", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "東京 café"} {
		ids := tok.Encode(s, EncodeOptions{})
		st := tok.NewStream()
		var pieces []string
		for _, id := range ids {
			if p := st.Next(id); p != "" {
				pieces = append(pieces, p)
			}
		}
		if f := st.Flush(); f != "" {
			t.Errorf("%q: Flush returned %q", s, f)
		}
		if strings.Join(pieces, "") != s {
			t.Errorf("%q: stream %q", s, pieces)
		}
		for _, p := range pieces {
			if strings.ContainsRune(p, utf8.RuneError) {
				t.Errorf("%q: piece %q has U+FFFD", s, p)
			}
		}
	}
	// a truncated character: held back, then flushed as U+FFFD
	st := tok.NewStream()
	ids := tok.Encode("😀", EncodeOptions{})
	if len(ids) < 2 {
		t.Skip("emoji is one token")
	}
	if p := st.Next(ids[0]); p != "" {
		t.Fatalf("partial emoji emitted %q", p)
	}
	if f := st.Flush(); f == "" || !strings.ContainsRune(f, utf8.RuneError) {
		t.Fatalf("Flush = %q", f)
	}
}

func TestSmolRandomBytes(t *testing.T) {
	tok := smol(t)
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		b := make([]byte, rng.Intn(64))
		for j := range b {
			switch rng.Intn(4) {
			case 0:
				b[j] = byte(rng.Intn(256))
			case 1:
				b[j] = " \t\n\r'0a<|>"[rng.Intn(10)]
			default:
				b[j] = byte(0x80 + rng.Intn(0x80))
			}
		}
		s := string(b)
		ids := tok.Encode(s, EncodeOptions{ParseSpecial: i%2 == 0, AddSpecial: true})
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("%q: id %d out of range", s, id)
			}
		}
		d := tok.DecodeWith(ids, DecodeOptions{Special: true})
		if utf8.ValidString(s) && d != s {
			t.Fatalf("round trip %q -> %q", s, d)
		}
		if !utf8.ValidString(d) {
			t.Fatalf("Decode produced invalid UTF-8 for %q", s)
		}
		// random ids decode and stream without panics, and agree
		rid := make([]int32, rng.Intn(20))
		for j := range rid {
			rid[j] = int32(rng.Intn(tok.VocabSize()+10) - 5)
		}
		st := tok.NewStream()
		var sb strings.Builder
		for _, id := range rid {
			sb.WriteString(st.Next(id))
		}
		sb.WriteString(st.Flush())
		if want := tok.Decode(rid); sb.String() != want {
			t.Fatalf("stream %q != Decode %q for %v", sb.String(), want, rid)
		}
	}
}

func TestSmolEncodeLargeText(t *testing.T) {
	tok := smol(t)
	cases := readJSONL[tokCase](t, "testdata/smollm2/tokenizer_cases.jsonl")
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		for _, c := range cases {
			sb.WriteString(c.Text)
			sb.WriteByte(' ')
		}
	}
	text := sb.String()
	// fresh tokenizer so the word cache starts cold
	cold, err := NewTokenizer(tok.Spec())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ids := cold.Encode(text, EncodeOptions{})
	el := time.Since(start)
	mbs := float64(len(text)) / 1e6 / el.Seconds()
	t.Logf("encoded %d bytes into %d tokens in %v: %.1f MB/s", len(text), len(ids), el, mbs)
	// Speed is measured by BenchmarkSmolEncode (make bench), not asserted here.
	if d := cold.Decode(ids); d != text {
		t.Fatal("round trip of 1 MB failed")
	}
}

func BenchmarkSmolEncode(b *testing.B) {
	tok := smol(b)
	text := strings.Repeat("The quick brown fox, 12345 times: café 東京 😀\n\tdef f(x): return x\n", 200)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, EncodeOptions{})
	}
}

// TestSmolDigitSplitMatters: the smollm pre-tokeniser (digits split first)
// is what the reference does; plain GPT-2 splitting differs when whitespace
// precedes digits.
func TestSmolDigitSplitMatters(t *testing.T) {
	tok := smol(t)
	spec := tok.Spec()
	spec.Pre = "gpt2"
	gpt2 := mustTok(t, spec)
	cases := readJSONL[tokCase](t, "testdata/smollm2/tokenizer_cases.jsonl")
	differ := 0
	for _, c := range cases {
		if !slices.Equal(gpt2.Encode(c.Text, EncodeOptions{ParseSpecial: c.ParseSpecial}), c.IDs) {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("fixture does not distinguish the smollm pre-tokeniser from GPT-2")
	}
	t.Logf("GPT-2 splitting differs from the reference on %d of %d cases", differ, len(cases))
}

// TestSmolConcurrent: Encode is safe for concurrent use (shared word cache).
func TestSmolConcurrent(t *testing.T) {
	tok := smol(t)
	cases := readJSONL[tokCase](t, "testdata/smollm2/tokenizer_cases.jsonl")
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(cases); i += 2 {
				c := cases[i]
				if got := tok.Encode(c.Text, EncodeOptions{ParseSpecial: c.ParseSpecial}); !slices.Equal(got, c.IDs) {
					t.Errorf("concurrent Encode(%q) differs", c.Text)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

// TestSmolEncodeSpeedUnique: throughput on text with few repeated words (word cache mostly missing).
func TestSmolEncodeSpeedUnique(t *testing.T) {
	tok := smol(t)
	rng := rand.New(rand.NewSource(5))
	var sb strings.Builder
	alpha := []rune("abcdefghijklmnopqrstuvwxyzéèàüöß東京北海道日本語")
	for sb.Len() < 1<<20 {
		n := 2 + rng.Intn(10)
		for i := 0; i < n; i++ {
			sb.WriteRune(alpha[rng.Intn(len(alpha))])
		}
		sb.WriteString([]string{" ", ", ", ".\n", " ", " 1234 "}[rng.Intn(5)])
	}
	cold, err := NewTokenizer(tok.Spec())
	if err != nil {
		t.Fatal(err)
	}
	text := sb.String()
	start := time.Now()
	ids := cold.Encode(text, EncodeOptions{})
	el := time.Since(start)
	t.Logf("unique words: %d bytes -> %d tokens in %v: %.1f MB/s", len(text), len(ids), el, float64(len(text))/1e6/el.Seconds())
	if d := cold.Decode(ids); d != text {
		t.Fatal("round trip failed")
	}
}

// TestSmolViaHFTokenizerJSON: the SmolLM2 vocabulary written as an HF
// tokenizer.json (the layout SmolLM2 publishes: Digits + ByteLevel, merges
// as pairs, control tokens as special added tokens) loads to the same ids.
func TestSmolViaHFTokenizerJSON(t *testing.T) {
	tok := smol(t)
	spec := tok.Spec()
	vocab := map[string]int32{}
	var added []map[string]any
	for i, s := range spec.Tokens {
		vocab[s] = int32(i)
		if spec.TokenTypes[i] == TokenControl {
			added = append(added, map[string]any{"id": i, "content": s, "special": true, "normalized": false})
		}
	}
	merges := make([][2]string, len(spec.Merges))
	for i, m := range spec.Merges {
		l, r, _ := strings.Cut(m, " ")
		merges[i] = [2]string{l, r}
	}
	unk := spec.Tokens[spec.UNK]
	tj := map[string]any{
		"version": "1.0", "added_tokens": added, "normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Digits", "individual_digits": true},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}}},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": unk, "fuse_unk": false, "byte_fallback": false,
			"ignore_merges": false, "vocab": vocab, "merges": merges},
	}
	cfg := map[string]any{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": unk, "pad_token": "<|im_end|>",
		"add_bos_token": false, "chat_template": spec.ChatTemplate}
	dir := t.TempDir()
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hf, err := LoadHFTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if hf.VocabSize() != tok.VocabSize() || hf.BOS() != 1 || hf.EOS() != 2 || hf.AddBOS() || hf.ChatTemplate() != spec.ChatTemplate ||
		!slices.Equal(hf.StopTokens(), tok.StopTokens()) {
		t.Fatalf("HF spec differs: vocab %d bos %d eos %d stops %v", hf.VocabSize(), hf.BOS(), hf.EOS(), hf.StopTokens())
	}
	for _, c := range readJSONL[tokCase](t, "testdata/smollm2/tokenizer_cases.jsonl") {
		if got := hf.Encode(c.Text, EncodeOptions{ParseSpecial: c.ParseSpecial}); !slices.Equal(got, c.IDs) {
			t.Fatalf("HF Encode(%q) = %v, want %v", c.Text, got, c.IDs)
		}
	}
}

// TestHFDeepSeek3PreTokenizer: DeepSeek-V3's tokenizer.json pre-tokenizer
// (three Splits, then ByteLevel without its regex) and Mistral's Tekken (one
// Split), as the tokenizers library writes them (model/testdata/*_pre_tokenizer.json),
// read as llama.cpp's "deepseek-v3" and "tekken"; a changed regex is refused by name.
func TestHFDeepSeek3PreTokenizer(t *testing.T) {
	tekken, err := os.ReadFile("testdata/tekken_pre_tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if name, err := hfPre(tekken); err != nil || name != "tekken" {
		t.Fatalf("hfPre(tekken): %q, %v", name, err)
	}
	raw, err := os.ReadFile("testdata/deepseek3_pre_tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	name, err := hfPre(raw)
	if err != nil || name != "deepseek-v3" {
		t.Fatalf("hfPre: %q, %v", name, err)
	}
	changed := strings.Replace(string(raw), `{1,3}`, `{1,4}`, 1)
	if _, err := hfPre(json.RawMessage(changed)); err == nil || !strings.Contains(err.Error(), "not DeepSeek-V3's split") {
		t.Fatalf("changed regex: %v", err)
	}
}
