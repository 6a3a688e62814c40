package model

import (
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// tinySpec: the 256 byte tokens (ids 0..255, in byte order), a few merges,
// a control token and a user-defined token.
func tinySpec(t testing.TB, merges ...string) TokenizerSpec {
	t.Helper()
	spec := TokenizerSpec{Model: "gpt2", Pre: "gpt2", BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	for b := 0; b < 256; b++ {
		spec.Tokens = append(spec.Tokens, string(byteToRune[b]))
		spec.TokenTypes = append(spec.TokenTypes, TokenNormal)
	}
	have := map[string]bool{}
	for _, m := range merges {
		l, r, _ := strings.Cut(m, " ")
		if !have[l+r] {
			have[l+r] = true
			spec.Tokens = append(spec.Tokens, l+r)
			spec.TokenTypes = append(spec.TokenTypes, TokenNormal)
		}
	}
	spec.Merges = merges
	for _, s := range []struct {
		text string
		typ  int32
	}{{"<|end|>", TokenControl}, {"<|begin|>", TokenControl}, {"<|e", TokenControl}, {"<tool>", TokenUserDefined}} {
		spec.Tokens = append(spec.Tokens, s.text)
		spec.TokenTypes = append(spec.TokenTypes, s.typ)
	}
	return spec
}

func mustTok(t testing.TB, spec TokenizerSpec) *Tokenizer {
	t.Helper()
	tok, err := NewTokenizer(spec)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func ids(t testing.TB, tok *Tokenizer, texts ...string) []int32 {
	t.Helper()
	var out []int32
	for _, s := range texts {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		out = append(out, id)
	}
	return out
}

func TestTinyMerges(t *testing.T) {
	tok := mustTok(t, tinySpec(t, "h e", "l l", "he ll", "hell o", "Ġ w", "a a", "b c", "a b", "o r", "Ġw or", "Ġwor l", "Ġworl d"))
	for _, c := range []struct {
		text string
		want []string
	}{
		{"hello", []string{"hello"}},
		{"hello world", []string{"hello", "Ġworld"}},
		{"aaa", []string{"aa", "a"}},     // leftmost on ties
		{"aaaa", []string{"aa", "aa"}},   //
		{"abc", []string{"a", "bc"}},     // "b c" ranks before "a b"
		{"hel", []string{"he", "l"}},     //
		{"  x", []string{"Ġ", "Ġ", "x"}}, // \s+(?!\S) leaves one space for " x"
	} {
		if got := tok.Encode(c.text, EncodeOptions{}); !slices.Equal(got, ids(t, tok, c.want...)) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
		if d := tok.Decode(tok.Encode(c.text, EncodeOptions{})); d != c.text {
			t.Errorf("Decode = %q, want %q", d, c.text)
		}
	}
}

// TestMergeHeapMatchesSmall: the O(n log n) merge loop used for long words
// agrees with the simple one.
func TestMergeHeapMatchesSmall(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	letters := []string{"a", "b", "c", "d"}
	var merges []string
	toks := append([]string(nil), letters...)
	seen := map[string]bool{}
	for len(merges) < 60 {
		l, r := toks[rng.Intn(len(toks))], toks[rng.Intn(len(toks))]
		if len(l+r) > 6 || seen[l+" "+r] {
			continue
		}
		seen[l+" "+r] = true
		merges = append(merges, l+" "+r)
		if !slices.Contains(toks, l+r) {
			toks = append(toks, l+r)
		}
	}
	tok := mustTok(t, tinySpec(t, merges...))
	for i := 0; i < 2000; i++ {
		b := make([]byte, 2+rng.Intn(120))
		for j := range b {
			b[j] = "abcd"[rng.Intn(4)]
		}
		syms := make([]int32, len(b))
		for j, c := range b {
			syms[j] = tok.byteTok[c]
		}
		small := tok.mergeSmall(slices.Clone(syms))
		big := tok.mergeHeap(slices.Clone(syms))
		if !slices.Equal(small, big) {
			t.Fatalf("%s: small %v heap %v", b, small, big)
		}
	}
}

func TestTinySpecialTokens(t *testing.T) {
	tok := mustTok(t, tinySpec(t))
	end, beg, e3, tool := ids(t, tok, "<|end|>")[0], ids(t, tok, "<|begin|>")[0], ids(t, tok, "<|e")[0], ids(t, tok, "<tool>")[0]
	got := tok.Encode("a<|end|>b<tool><|begin|><|e", EncodeOptions{ParseSpecial: true})
	want := []int32{'a', end, 'b', tool, beg, e3} // byte tokens of ASCII letters have the byte's id
	if !slices.Equal(got, want) {
		t.Fatalf("ParseSpecial: %v, want %v (longest match first)", got, want)
	}
	// without ParseSpecial control texts are plain text, user-defined still match
	got = tok.Encode("<|end|><tool>", EncodeOptions{})
	if slices.Contains(got, end) || !slices.Contains(got, tool) {
		t.Fatalf("no ParseSpecial: %v", got)
	}
	if d := tok.Decode([]int32{'a', end, tool}); d != "a<tool>" {
		t.Fatalf("Decode skips control, keeps user-defined: %q", d)
	}
	if d := tok.DecodeWith([]int32{'a', end}, DecodeOptions{Special: true}); d != "a<|end|>" {
		t.Fatalf("DecodeWith Special: %q", d)
	}
}

func TestTinyAddSpecialAndStops(t *testing.T) {
	spec := tinySpec(t)
	spec.BOS, spec.EOS, spec.AddBOS, spec.AddEOS = int32(len(spec.Tokens)-3), int32(len(spec.Tokens)-4), true, true
	spec.Tokens = append(spec.Tokens, "<|im_end|>", "<|eot_id|>")
	spec.TokenTypes = append(spec.TokenTypes, TokenControl, TokenNormal) // a normal "<|eot_id|>" is not a stop
	tok := mustTok(t, spec)
	got := tok.Encode("x", EncodeOptions{AddSpecial: true})
	if !slices.Equal(got, []int32{spec.BOS, 'x', spec.EOS}) {
		t.Fatalf("AddSpecial: %v", got)
	}
	if got := tok.Encode("x", EncodeOptions{}); !slices.Equal(got, []int32{'x'}) {
		t.Fatalf("no AddSpecial: %v", got)
	}
	imEnd := int32(len(spec.Tokens) - 2)
	if got := tok.StopTokens(); !slices.Equal(got, []int32{spec.EOS, imEnd}) {
		t.Fatalf("StopTokens %v, want [%d %d]", got, spec.EOS, imEnd)
	}
}

func TestTinyRefusals(t *testing.T) {
	spec := tinySpec(t)
	spec.Model = "bert"
	if _, err := NewTokenizer(spec); err == nil || !strings.Contains(err.Error(), `"bert"`) {
		t.Fatalf("model bert: %v", err)
	}
	spec.Model = "llama"
	if _, err := NewTokenizer(spec); err == nil || !strings.Contains(err.Error(), "0 scores for 260 tokens") {
		t.Fatalf("model llama without scores: %v", err)
	}
	spec = tinySpec(t)
	spec.Pre = "klingon"
	if _, err := NewTokenizer(spec); err == nil || !strings.Contains(err.Error(), `"klingon"`) || !strings.Contains(err.Error(), `"smollm"`) {
		t.Fatalf("pre klingon: %v", err)
	}
	spec = tinySpec(t)
	spec.TokenTypes = spec.TokenTypes[:3]
	if _, err := NewTokenizer(spec); err == nil {
		t.Fatal("short token types accepted")
	}
	spec = tinySpec(t)
	spec.EOS = 1 << 20
	if _, err := NewTokenizer(spec); err == nil || !strings.Contains(err.Error(), "EOS") {
		t.Fatalf("EOS out of range: %v", err)
	}
}

func TestTinyStream(t *testing.T) {
	tok := mustTok(t, tinySpec(t))
	s := "a😀b€é"
	var got []string
	st := tok.NewStream()
	for _, id := range tok.Encode(s, EncodeOptions{}) { // one token per byte
		if p := st.Next(id); p != "" {
			got = append(got, p)
		}
	}
	if !slices.Equal(got, []string{"a", "😀", "b", "€", "é"}) || st.Flush() != "" {
		t.Fatalf("stream %q", got)
	}
	// an invalid byte in the middle comes out as U+FFFD without waiting
	st = tok.NewStream()
	if p := st.Next(0xE2); p != "" {
		t.Fatalf("lead byte emitted %q", p)
	}
	if p := st.Next('x'); p != "\uFFFDx" {
		t.Fatalf("after invalid: %q", p)
	}
	if p := st.Next(0xF0) + st.Next(0x9F); p != "" {
		t.Fatalf("partial emitted %q", p)
	}
	if f := st.Flush(); f != "\uFFFD\uFFFD" {
		t.Fatalf("Flush %q", f)
	}
	if d := tok.Decode([]int32{0xE2, 'x', 0xF0, 0x9F}); d != "\uFFFDx\uFFFD\uFFFD" {
		t.Fatalf("Decode %q", d)
	}
}

type pretokCase struct {
	Pre    string   `json:"pre"`
	Text   string   `json:"text"`
	Pieces []string `json:"pieces"`
}

// TestPretokFixture: the hand-written scanners split exactly as the
// standard regexes do (reference: tokenizers' Split with Oniguruma).
func TestPretokFixture(t *testing.T) {
	cases := readJSONL[pretokCase](t, "testdata/pretok_cases.jsonl")
	fails := 0
	counts := map[string]int{}
	for _, c := range cases {
		k, err := lookupPre(c.Pre)
		if err != nil {
			t.Fatal(err)
		}
		counts[c.Pre]++
		var got []string
		k.split(c.Text, func(s string) { got = append(got, s) })
		if !slices.Equal(got, c.Pieces) {
			fails++
			if fails <= 10 {
				t.Errorf("%s %q:\n got %q\nwant %q", c.Pre, c.Text, got, c.Pieces)
			}
		}
	}
	if fails > 0 {
		t.Errorf("%d of %d pre-tokeniser cases differ", fails, len(cases))
	}
	t.Logf("pre-tokeniser cases: %v", counts)
}

func TestPretokInvalidBytes(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for i := 0; i < 5000; i++ {
		b := make([]byte, rng.Intn(40))
		for j := range b {
			b[j] = byte(rng.Intn(256))
			if rng.Intn(3) == 0 {
				b[j] = " \n\r\t1a'"[rng.Intn(7)]
			}
		}
		for _, k := range []preKind{preGPT2, preLlama3, preQwen2, preDigitsGPT2} {
			var sb strings.Builder
			k.split(string(b), func(s string) {
				if s == "" {
					t.Fatalf("empty piece for %q", b)
				}
				sb.WriteString(s)
			})
			if sb.String() != string(b) {
				t.Fatalf("pieces of %q do not rejoin", b)
			}
		}
	}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hfDir writes a minimal HF tokenizer.json (+ tokenizer_config.json) for
// the tiny vocabulary.
func hfDir(t testing.TB, mutate func(tj, cfg map[string]any)) string {
	spec := tinySpec(t, "h e", "l l", "he ll", "hell o")
	vocab := map[string]int{}
	var added []map[string]any
	for i, tok := range spec.Tokens {
		vocab[tok] = i
		if spec.TokenTypes[i] != TokenNormal {
			added = append(added, map[string]any{"id": i, "content": tok, "special": spec.TokenTypes[i] == TokenControl,
				"single_word": false, "lstrip": false, "rstrip": false, "normalized": false})
		}
	}
	merges := []any{"h e", []string{"l", "l"}, "he ll", []string{"hell", "o"}}
	tj := map[string]any{
		"version":        "1.0",
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges},
	}
	cfg := map[string]any{
		"bos_token":     map[string]any{"content": "<|begin|>", "special": true},
		"eos_token":     "<|end|>",
		"add_bos_token": true,
		"chat_template": []map[string]any{{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}},
	}
	if mutate != nil {
		mutate(tj, cfg)
	}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)
	if cfg != nil {
		writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
	}
	return dir
}

func TestLoadHFTokenizer(t *testing.T) {
	tok, err := LoadHFTokenizer(hfDir(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if tok.BOS() != ids(t, tok, "<|begin|>")[0] || tok.EOS() != ids(t, tok, "<|end|>")[0] || !tok.AddBOS() {
		t.Fatalf("bos %d eos %d addbos %v", tok.BOS(), tok.EOS(), tok.AddBOS())
	}
	if tok.ChatTemplate() != "D{{ bos_token }}" {
		t.Fatalf("chat template %q", tok.ChatTemplate())
	}
	got := tok.Encode("hello<|end|>", EncodeOptions{AddSpecial: true, ParseSpecial: true})
	if want := ids(t, tok, "<|begin|>", "hello", "<|end|>"); !slices.Equal(got, want) {
		t.Fatalf("Encode %v, want %v", got, want)
	}
	// digits + byte-level is the smollm pre-tokeniser
	tok, err = LoadHFTokenizer(hfDir(t, func(tj, _ map[string]any) {
		tj["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Digits", "individual_digits": true},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}}}
	}))
	if err != nil || tok.Spec().Pre != "smollm" {
		t.Fatalf("Digits+ByteLevel: %v", err)
	}
	// Split(llama-3 regex) + ByteLevel(use_regex=false), chat_template.jinja, no config
	tok, err = LoadHFTokenizer(hfDir(t, func(tj, cfg map[string]any) {
		tj["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`},
				"behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}
		clear(cfg)
	}))
	if err != nil || tok.Spec().Pre != "llama-bpe" {
		t.Fatalf("Split+ByteLevel: %v", err)
	}
}

func TestLoadHFTokenizerRefusals(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(tj, cfg map[string]any)
		want   string
	}{
		{"wordpiece", func(tj, _ map[string]any) { tj["model"].(map[string]any)["type"] = "WordPiece" }, `"WordPiece"`},
		{"unigram", func(tj, _ map[string]any) { tj["model"] = map[string]any{"type": "Unigram"} }, `"Unigram"`},
		{"normalizer", func(tj, _ map[string]any) { tj["normalizer"] = map[string]any{"type": "NFC"} }, `normalizer "NFC"`},
		{"metaspace", func(tj, _ map[string]any) { tj["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }, "Metaspace"},
		{"prefix space", func(tj, _ map[string]any) {
			tj["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true}
		}, "add_prefix_space"},
		{"decoder", func(tj, _ map[string]any) { tj["decoder"] = map[string]any{"type": "WordPiece"} }, `decoder "WordPiece"`},
		{"byte fallback", func(tj, _ map[string]any) { tj["model"].(map[string]any)["byte_fallback"] = true }, "byte_fallback"},
		{"bos unknown", func(_, cfg map[string]any) { cfg["bos_token"] = "<nope>" }, "bos_token"},
		{"no default template", func(_, cfg map[string]any) {
			cfg["chat_template"] = []map[string]any{{"name": "rag", "template": "x"}}
		}, `"default"`},
	} {
		_, err := LoadHFTokenizer(hfDir(t, c.mutate))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to mention %s", c.name, err, c.want)
		}
	}
	if _, err := LoadHFTokenizer(t.TempDir()); err == nil {
		t.Error("empty directory accepted")
	}
}

func TestRenderChatLlama3(t *testing.T) {
	src, err := os.ReadFile("testdata/llama3_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []ChatMessage{
		{Role: "system", Content: "You are helpful."},
		{Role: "user", Content: "  Hi there \n"},
		{Role: "assistant", Content: "Hello!"},
		{Role: "user", Content: "Bye"},
	}
	got, err := RenderChat(string(src), msgs, true, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		t.Fatal(err)
	}
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	if got != want {
		t.Fatalf("render\n got %q\nwant %q", got, want)
	}
	got, err = RenderChat(string(src), msgs[:2], false, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil || strings.HasSuffix(got, "assistant<|end_header_id|>\n\n") {
		t.Fatalf("no generation prompt: %q %v", got, err)
	}
}

func TestRenderChatFunctions(t *testing.T) {
	tmpl := `{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}` +
		`{{ strftime_now('%Y') }}|{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ eos_token }}`
	_, err := RenderChat(tmpl, []ChatMessage{{Role: "user", Content: "x"}}, false, "", "")
	if err == nil || !strings.Contains(err.Error(), "first message must be system") {
		t.Fatalf("raise_exception: %v", err)
	}
	got, err := RenderChat(tmpl, []ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}}, false, "", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	year := time.Now().Format("2006")
	if got != year+"|system:s;user:u;</s>" && !strings.HasSuffix(got, "|system:s;user:u;</s>") {
		t.Fatalf("render %q", got)
	}
	if _, err := RenderChat("{% if %}", nil, false, "", ""); err == nil {
		t.Fatal("bad template accepted")
	}
	if _, err := RenderChat("", nil, false, "", ""); err == nil {
		t.Fatal("empty template accepted")
	}
}
