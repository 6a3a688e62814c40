package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// HF tokenizer.json, only the parts a byte-level BPE tokenizer uses.
type hfTokenizerJSON struct {
	AddedTokens []struct {
		ID      int32  `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]int32  `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Dropout                 *float64          `json:"dropout"`
	} `json:"model"`
}

type hfComponent struct {
	Type           string          `json:"type"`
	AddPrefixSpace *bool           `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	IndividualDig  bool            `json:"individual_digits"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	Pretokenizers  []hfComponent   `json:"pretokenizers"`
	Decoders       []hfComponent   `json:"decoders"`
	Single         []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
	} `json:"single"`
	Processors []hfComponent `json:"processors"`
}

// The split regexes of the pre-tokenisers NewTokenizer knows, as HF
// tokenizer.json files spell them in a Split pre-tokenizer.
var hfSplitRegexes = map[string]string{
	`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`:                                                                                                                                          "gpt2",
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                                                                                 "llama-bpe",
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                                                                                      "qwen2",
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`: "tekken",
}

// hfDeepSeek3Splits are the three Split regexes of DeepSeek-V3/R1's
// tokenizer.json, in order (llama.cpp's "deepseek-v3").
var hfDeepSeek3Splits = []string{
	`\p{N}{1,3}`,
	`[一-龥぀-ゟ゠-ヿ]+`,
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
}

// LoadHFTokenizer builds a tokenizer from a Hugging Face model directory:
// tokenizer.json (model.type "BPE", byte-level pre-tokenizer and decoder)
// and, if present, tokenizer_config.json (bos/eos/pad token,
// add_bos_token, add_eos_token, chat_template) or chat_template.jinja.
// Anything else is refused with the reason.
func LoadHFTokenizer(dir string) (*Tokenizer, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	var tj hfTokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		return nil, fmt.Errorf("model: tokenizer.json: %w", err)
	}
	spec, ignoreMerges, err := hfSpec(&tj, hfConfigVocab(dir))
	if err != nil {
		return nil, fmt.Errorf("model: %s/tokenizer.json: %w", dir, err)
	}
	vocab := make(map[string]int32, len(spec.Tokens))
	for i, tok := range spec.Tokens {
		if _, dup := vocab[tok]; !dup {
			vocab[tok] = int32(i)
		}
	}
	if err := hfConfig(dir, &spec, vocab); err != nil {
		return nil, fmt.Errorf("model: %s/tokenizer_config.json: %w", dir, err)
	}
	if spec.AddBOS == false && spec.BOS >= 0 {
		spec.AddBOS = hfPostAddsBOS(tj.PostProcessor, spec.Tokens[spec.BOS])
	}
	t, err := NewTokenizer(spec)
	if err != nil {
		return nil, err
	}
	t.ignoreMerges = ignoreMerges
	if t.spm {
		// The tokenizers library decodes added tokens through the decoder
		// too: the "▁" of one (Gemma's user-defined runs of spaces, "▁▁")
		// comes out as a space, as llama.cpp's converter writes such a token.
		for id, typ := range t.types {
			if typ == TokenControl || typ == TokenUserDefined {
				t.pieces[id] = []byte(strings.ReplaceAll(spec.Tokens[id], "▁", " "))
			}
		}
	}
	return t, nil
}

// hfConfigVocab is config.json's vocab_size in dir (0 when absent): the
// model's embedding rows, which may exceed the tokenizer's entries.
func hfConfigVocab(dir string) int64 {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return 0
	}
	var c struct {
		VocabSize int64 `json:"vocab_size"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return 0
	}
	return max(c.VocabSize, 0)
}

// hfSpec reads tokenizer.json's model. Token ids must lie below the
// vocabulary's size: the number of entries, or config.json's vocab_size
// (configVocab) when larger; a larger id would size the tables by an
// attacker's number.
func hfSpec(tj *hfTokenizerJSON, configVocab int64) (TokenizerSpec, bool, error) {
	spec := TokenizerSpec{Model: "gpt2", BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	m := &tj.Model
	if m.Type != "BPE" {
		if m.Type == "" {
			return spec, false, errors.New("model.type is missing (only BPE is supported)")
		}
		return spec, false, fmt.Errorf("model.type %q is not supported (only byte-level BPE)", m.Type)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return spec, false, errors.New("BPE with continuing_subword_prefix or end_of_word_suffix is not supported")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return spec, false, errors.New("BPE dropout is not supported")
	}
	if m.ByteFallback {
		// A SentencePiece vocabulary (Llama 2, Mistral): "▁" for spaces,
		// <0xXX> byte tokens (spm.go).
		spec.Model = "llama"
		if err := hfMetaspace(tj, &spec); err != nil {
			return spec, false, err
		}
	} else {
		if n := strings.TrimSpace(string(tj.Normalizer)); n != "" && n != "null" {
			var c hfComponent
			_ = json.Unmarshal(tj.Normalizer, &c)
			return spec, false, fmt.Errorf("normalizer %q is not supported", c.Type)
		}
		pre, err := hfPre(tj.PreTokenizer)
		if err != nil {
			return spec, false, err
		}
		spec.Pre = pre
		if err := hfDecoder(tj.Decoder); err != nil {
			return spec, false, err
		}
	}

	limit := max(int64(len(m.Vocab)+len(tj.AddedTokens)), configVocab)
	outside := func(what, tok string, id int32) error {
		return fmt.Errorf("%s %q has id %d, outside the vocabulary [0, %d) (%d entries; config.json vocab_size %d)",
			what, tok, id, limit, len(m.Vocab)+len(tj.AddedTokens), configVocab)
	}
	n := int32(0)
	for tok, id := range m.Vocab {
		if id < 0 || int64(id) >= limit {
			return spec, false, outside("vocab entry", tok, id)
		}
		n = max(n, id+1)
	}
	for _, at := range tj.AddedTokens {
		if at.ID < 0 || int64(at.ID) >= limit {
			return spec, false, outside("added token", at.Content, at.ID)
		}
		n = max(n, at.ID+1)
	}
	if n == 0 {
		return spec, false, errors.New("empty vocabulary")
	}
	spec.Tokens = make([]string, n)
	spec.TokenTypes = make([]int32, n)
	seen := make([]bool, n)
	for tok, id := range m.Vocab {
		spec.Tokens[id], spec.TokenTypes[id], seen[id] = tok, TokenNormal, true
		if _, isByte := spmByte(tok); isByte && m.ByteFallback {
			spec.TokenTypes[id] = TokenByte
		}
	}
	for _, at := range tj.AddedTokens {
		typ := int32(TokenUserDefined)
		if at.Special {
			typ = TokenControl
		}
		spec.Tokens[at.ID], spec.TokenTypes[at.ID], seen[at.ID] = at.Content, typ, true
	}
	for i, ok := range seen {
		if !ok {
			spec.TokenTypes[i] = TokenUnused
		}
	}
	var err error
	if spec.Merges, err = hfMerges(m.Merges, m.Vocab); err != nil {
		return spec, false, err
	}
	if m.UnkToken != nil {
		if id, ok := m.Vocab[*m.UnkToken]; ok {
			spec.UNK = id
		}
	}
	return spec, m.IgnoreMerges, nil
}

// hfMetaspace reads where a SentencePiece tokenizer.json puts "▁": a
// normalizer that prepends "▁" to each run of text and replaces spaces
// (Llama 2's), one that only replaces them (Gemma's: no pre-tokenizer, or
// the Split at " " transformers writes, which then finds no space), or a
// Metaspace pre-tokenizer (prepend_scheme, split; Mistral's); and checks
// that its decoder undoes it.
func hfMetaspace(tj *hfTokenizerJSON, spec *TokenizerSpec) error {
	type comp struct {
		Type    string `json:"type"`
		Prepend string `json:"prepend"`
		Pattern struct {
			String *string `json:"String"`
		} `json:"pattern"`
		Content        string  `json:"content"`
		Replacement    string  `json:"replacement"`
		PrependScheme  string  `json:"prepend_scheme"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		Split          *bool   `json:"split"`
		Normalizers    []comp  `json:"normalizers"`
		Decoders       []comp  `json:"decoders"`
		Pretokenizers  []comp  `json:"pretokenizers"`
		Start          int     `json:"start"`
		Stop           int     `json:"stop"`
		Other          *string `json:"other"`
		Invert         bool    `json:"invert"`
	}
	null := func(raw json.RawMessage) bool { n := strings.TrimSpace(string(raw)); return n == "" || n == "null" }
	replaces := func(c comp, from, to string) bool {
		return c.Type == "Replace" && c.Pattern.String != nil && *c.Pattern.String == from && c.Content == to
	}
	spec.SpacePrefix = PrefixNever
	escaped := false
	if !null(tj.Normalizer) {
		var n comp
		if err := json.Unmarshal(tj.Normalizer, &n); err != nil {
			return fmt.Errorf("normalizer: %w", err)
		}
		parts := []comp{n}
		if n.Type == "Sequence" {
			parts = n.Normalizers
		}
		for i, c := range parts {
			switch {
			case c.Type == "Prepend" && c.Prepend == "▁" && i == 0:
				spec.SpacePrefix = PrefixEveryRun
			case replaces(c, " ", "▁"):
				escaped = true
			default:
				return fmt.Errorf("normalizer %s is not supported with byte_fallback (Prepend \"▁\" and Replace \" \" by \"▁\" are)", c.Type)
			}
		}
	}
	if !null(tj.PreTokenizer) {
		var p comp
		if err := json.Unmarshal(tj.PreTokenizer, &p); err != nil {
			return fmt.Errorf("pre_tokenizer: %w", err)
		}
		switch {
		case p.Type == "Split" && p.Pattern.String != nil && *p.Pattern.String == " " && !p.Invert && escaped:
			// transformers' GemmaTokenizer: a Split at " " after a normalizer
			// that has turned every space into "▁" finds nothing to split.
		case p.Type == "Metaspace" && p.Replacement == "▁" && !escaped && spec.SpacePrefix == PrefixNever:
			escaped = true
			scheme := p.PrependScheme
			if scheme == "" && p.AddPrefixSpace != nil { // older files
				scheme = map[bool]string{true: "always", false: "never"}[*p.AddPrefixSpace]
			}
			switch scheme {
			case "always":
				spec.SpacePrefix = PrefixUnlessSpace
			case "first":
				spec.SpacePrefix = PrefixFirstRun
			case "never":
			default:
				return fmt.Errorf("pre_tokenizer Metaspace prepend_scheme %q is not supported (always, first, never)", scheme)
			}
			spec.SplitWords = p.Split == nil || *p.Split
		default:
			return fmt.Errorf("pre_tokenizer %s (replacement %q) is not supported with byte_fallback: a Metaspace of \"▁\" without a normalizer that does its work, or a Split at \" \" after a normalizer that replaces every \" \" by \"▁\", is", p.Type, p.Replacement)
		}
	}
	if !escaped {
		return errors.New("byte_fallback without a normalizer or Metaspace pre_tokenizer that turns spaces into \"▁\" is not supported")
	}
	if null(tj.Decoder) {
		return errors.New("decoder is missing (a byte-fallback vocabulary needs \"▁\" turned back into spaces)")
	}
	var d comp
	if err := json.Unmarshal(tj.Decoder, &d); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	parts := []comp{d}
	if d.Type == "Sequence" {
		parts = d.Decoders
	}
	unescaped := false
	for _, c := range parts {
		switch {
		case replaces(c, "▁", " "), c.Type == "Metaspace":
			unescaped = true
		case c.Type == "ByteFallback", c.Type == "Fuse", c.Type == "Strip" && c.Content == " ":
		default:
			return fmt.Errorf("decoder %s is not supported with byte_fallback (Replace \"▁\" by \" \", ByteFallback, Fuse, Strip, Metaspace are)", c.Type)
		}
	}
	if !unescaped {
		return errors.New("decoder does not turn \"▁\" back into spaces (a Replace of \"▁\" by \" \" or a Metaspace does)")
	}
	return nil
}

// hfMerges reads the merges ("a b" or [a, b]); as HF tokenizers, both
// parts and their union must be tokens of vocab.
func hfMerges(raws []json.RawMessage, vocab map[string]int32) ([]string, error) {
	merges := make([]string, 0, len(raws))
	for i, raw := range raws {
		var left, right string
		var s string
		var pair []string
		if err := json.Unmarshal(raw, &s); err == nil {
			var ok bool
			if left, right, ok = strings.Cut(s, " "); !ok {
				return nil, fmt.Errorf("merge %d %q is not \"a b\"", i, s)
			}
		} else if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("merge %d is neither \"a b\" nor [a, b]: %s", i, raw)
		} else {
			left, right = pair[0], pair[1]
		}
		for _, part := range []string{left, right, left + right} {
			if _, ok := vocab[part]; !ok {
				return nil, fmt.Errorf("merge %d (%q, %q): %q is not in the vocabulary", i, left, right, part)
			}
		}
		merges = append(merges, left+" "+right)
	}
	return merges, nil
}

// hfPre maps a pre_tokenizer to a tokenizer.ggml.pre name.
func hfPre(raw json.RawMessage) (string, error) {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil || c.Type == "" {
		return "", errors.New("pre_tokenizer is missing (a byte-level BPE needs ByteLevel)")
	}
	byteLevel := func(c hfComponent, regex bool) error {
		if c.Type != "ByteLevel" {
			return fmt.Errorf("pre_tokenizer %q is not supported", c.Type)
		}
		if c.AddPrefixSpace != nil && *c.AddPrefixSpace {
			return errors.New("ByteLevel pre_tokenizer with add_prefix_space is not supported")
		}
		if useRegex := c.UseRegex == nil || *c.UseRegex; useRegex != regex {
			return fmt.Errorf("ByteLevel pre_tokenizer with use_regex=%v is not supported here", useRegex)
		}
		return nil
	}
	switch {
	case c.Type == "ByteLevel":
		return "gpt2", byteLevel(c, true)
	case c.Type == "Sequence" && len(c.Pretokenizers) == 2:
		first, second := c.Pretokenizers[0], c.Pretokenizers[1]
		if first.Type == "Digits" && first.IndividualDig {
			return "smollm", byteLevel(second, true)
		}
		if first.Type == "Split" {
			var pat struct {
				Regex string `json:"Regex"`
			}
			_ = json.Unmarshal(first.Pattern, &pat)
			name, ok := hfSplitRegexes[pat.Regex]
			if !ok || first.Invert || !strings.EqualFold(first.Behavior, "Isolated") {
				return "", fmt.Errorf("pre_tokenizer Split with regex %q (behavior %q) is not supported", pat.Regex, first.Behavior)
			}
			return name, byteLevel(second, false)
		}
	case c.Type == "Sequence" && len(c.Pretokenizers) == len(hfDeepSeek3Splits)+1:
		for i, want := range hfDeepSeek3Splits {
			p := c.Pretokenizers[i]
			var pat struct {
				Regex string `json:"Regex"`
			}
			_ = json.Unmarshal(p.Pattern, &pat)
			if p.Type != "Split" || pat.Regex != want || p.Invert || !strings.EqualFold(p.Behavior, "Isolated") {
				return "", fmt.Errorf("pre_tokenizer Sequence of %d: part %d (%s %q) is not DeepSeek-V3's split", len(c.Pretokenizers), i, p.Type, pat.Regex)
			}
		}
		return "deepseek-v3", byteLevel(c.Pretokenizers[len(hfDeepSeek3Splits)], false)
	}
	types := []string{c.Type}
	for _, p := range c.Pretokenizers {
		types = append(types, p.Type)
	}
	return "", fmt.Errorf("pre_tokenizer %s is not supported (ByteLevel, Digits+ByteLevel or Split+ByteLevel)", strings.Join(types, "/"))
}

func hfDecoder(raw json.RawMessage) error {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil || c.Type == "" {
		return errors.New("decoder is missing (a byte-level BPE needs ByteLevel)")
	}
	if c.Type == "ByteLevel" {
		return nil
	}
	if c.Type == "Sequence" && len(c.Decoders) == 1 && c.Decoders[0].Type == "ByteLevel" {
		return nil
	}
	return fmt.Errorf("decoder %q is not supported (only ByteLevel)", c.Type)
}

// hfPostAddsBOS: a TemplateProcessing post-processor whose single-sequence
// template starts with the BOS token adds BOS (Llama 3 does this instead of
// setting add_bos_token).
func hfPostAddsBOS(raw json.RawMessage, bos string) bool {
	var c hfComponent
	if json.Unmarshal(raw, &c) != nil {
		return false
	}
	procs := []hfComponent{c}
	if c.Type == "Sequence" {
		procs = c.Processors
	}
	for _, p := range procs {
		if p.Type == "TemplateProcessing" && len(p.Single) > 0 && p.Single[0].SpecialToken != nil {
			return p.Single[0].SpecialToken.ID == bos
		}
	}
	return false
}

// hfConfig reads tokenizer_config.json (optional) and chat_template.jinja (optional).
func hfConfig(dir string, spec *TokenizerSpec, vocab map[string]int32) error {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err == nil {
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return err
		}
		for _, f := range []struct {
			key string
			dst *int32
		}{{"bos_token", &spec.BOS}, {"eos_token", &spec.EOS}, {"pad_token", &spec.PAD}, {"unk_token", &spec.UNK}} {
			text, ok, err := hfTokenText(cfg[f.key])
			if err != nil {
				return fmt.Errorf("%s: %w", f.key, err)
			}
			if !ok {
				continue
			}
			id, found := vocab[text]
			if !found {
				return fmt.Errorf("%s %q is not in the vocabulary", f.key, text)
			}
			*f.dst = id
		}
		for _, f := range []struct {
			key string
			dst *bool
		}{{"add_bos_token", &spec.AddBOS}, {"add_eos_token", &spec.AddEOS}} {
			if v, ok := cfg[f.key]; ok && string(v) != "null" {
				if err := json.Unmarshal(v, f.dst); err != nil {
					return fmt.Errorf("%s: %w", f.key, err)
				}
			}
		}
		if v, ok := cfg["chat_template"]; ok && string(v) != "null" {
			var s string
			if json.Unmarshal(v, &s) == nil {
				spec.ChatTemplate = s
			} else {
				var named []struct {
					Name     string `json:"name"`
					Template string `json:"template"`
				}
				if err := json.Unmarshal(v, &named); err != nil {
					return fmt.Errorf("chat_template is neither a string nor a list of named templates")
				}
				found := false
				for _, nt := range named {
					if nt.Name == "default" {
						spec.ChatTemplate, found = nt.Template, true
					}
				}
				if !found {
					return fmt.Errorf("chat_template list has no template named \"default\"")
				}
			}
		}
	}
	if spec.ChatTemplate == "" {
		if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
			spec.ChatTemplate = string(b)
		}
	}
	return nil
}

// hfTokenText reads a special token given as a string or an AddedToken object.
func hfTokenText(v json.RawMessage) (string, bool, error) {
	if len(v) == 0 || string(v) == "null" {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(v, &obj); err != nil || obj.Content == nil {
		return "", false, fmt.Errorf("neither a string nor {\"content\": ...}: %s", v)
	}
	return *obj.Content, true, nil
}
