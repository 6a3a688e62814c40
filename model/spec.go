package model

import (
	"fmt"
	"math"

	gguf "github.com/gpustack/gguf-parser-go"
)

// TokenizerSpecFromGGUF reads the tokenizer.* metadata of a GGUF file
// (parsed without SkipLargeMetadata, so the token and merge arrays are
// present). Errors name the missing or malformed key.
func TokenizerSpecFromGGUF(kvs gguf.GGUFMetadataKVs) (TokenizerSpec, error) {
	spec := TokenizerSpec{BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	var err error
	if spec.Model, err = ggufString(kvs, "tokenizer.ggml.model", true); err != nil {
		return spec, err
	}
	if spec.Pre, err = ggufString(kvs, "tokenizer.ggml.pre", false); err != nil {
		return spec, err
	}
	if spec.ChatTemplate, err = ggufString(kvs, "tokenizer.chat_template", false); err != nil {
		return spec, err
	}
	if spec.Tokens, err = ggufStrings(kvs, "tokenizer.ggml.tokens", true); err != nil {
		return spec, err
	}
	if spec.Merges, err = ggufStrings(kvs, "tokenizer.ggml.merges", false); err != nil {
		return spec, err
	}
	if kv, ok := kvs.Get("tokenizer.ggml.token_type"); ok {
		if kv.ValueType != gguf.GGUFMetadataValueTypeArray {
			return spec, fmt.Errorf("model: GGUF key tokenizer.ggml.token_type has type %v, want array", kv.ValueType)
		}
		av := kv.ValueArray()
		if !av.Type.IsNumeric() || uint64(len(av.Array)) != av.Len {
			return spec, fmt.Errorf("model: GGUF key tokenizer.ggml.token_type is an array of %v with %d of %d values loaded", av.Type, len(av.Array), av.Len)
		}
		spec.TokenTypes = make([]int32, av.Len)
		for i, v := range av.Array {
			spec.TokenTypes[i] = int32(toInt64(v))
		}
		if len(spec.TokenTypes) != len(spec.Tokens) {
			return spec, fmt.Errorf("model: GGUF key tokenizer.ggml.token_type has %d entries for %d tokens", len(spec.TokenTypes), len(spec.Tokens))
		}
	}
	if spec.Model == "llama" {
		// SentencePiece: llama.cpp's defaults, which the keys below override.
		spec.AddBOS = true
		for _, d := range []struct {
			dst *int32
			id  int32
		}{{&spec.UNK, 0}, {&spec.BOS, 1}, {&spec.EOS, 2}} {
			if int(d.id) < len(spec.Tokens) {
				*d.dst = d.id
			}
		}
		if spec.Scores, err = ggufFloats(kvs, "tokenizer.ggml.scores", len(spec.Tokens)); err != nil {
			return spec, err
		}
	}
	for _, f := range []struct {
		key string
		dst *int32
	}{
		{"tokenizer.ggml.bos_token_id", &spec.BOS},
		{"tokenizer.ggml.eos_token_id", &spec.EOS},
		{"tokenizer.ggml.unknown_token_id", &spec.UNK},
		{"tokenizer.ggml.padding_token_id", &spec.PAD},
		{"tokenizer.ggml.eot_token_id", &spec.EOT},
	} {
		kv, ok := kvs.Get(f.key)
		if !ok {
			continue
		}
		if !kv.ValueType.IsNumeric() {
			return spec, fmt.Errorf("model: GGUF key %s has type %v, want an integer", f.key, kv.ValueType)
		}
		id := gguf.ValueNumeric[int64](kv)
		if id < 0 || id >= int64(len(spec.Tokens)) {
			return spec, fmt.Errorf("model: GGUF key %s = %d is outside the %d tokens", f.key, id, len(spec.Tokens))
		}
		*f.dst = int32(id)
	}
	spacePrefix := true
	for _, f := range []struct {
		key string
		dst *bool
	}{
		{"tokenizer.ggml.add_bos_token", &spec.AddBOS},
		{"tokenizer.ggml.add_eos_token", &spec.AddEOS},
		{"tokenizer.ggml.add_space_prefix", &spacePrefix},
	} {
		kv, ok := kvs.Get(f.key)
		if !ok {
			continue
		}
		if kv.ValueType != gguf.GGUFMetadataValueTypeBool {
			return spec, fmt.Errorf("model: GGUF key %s has type %v, want bool", f.key, kv.ValueType)
		}
		*f.dst = kv.ValueBool()
	}
	if !spacePrefix {
		spec.SpacePrefix = PrefixNever
	}
	if noBOSPre[spec.Pre] {
		// llama.cpp's GLM vocabularies have no BOS whatever the file says
		// (their templates write [gMASK]<sop> themselves).
		spec.BOS, spec.AddBOS = -1, false
	}
	return spec, nil
}

// noBOSPre are the pre-tokenisers whose vocabularies llama.cpp gives no
// BOS token.
var noBOSPre = map[string]bool{"glm4": true, "glm5": true, "chatglm-bpe": true}

// LoadGGUFTokenizer parses a GGUF file and builds its tokenizer.
func LoadGGUFTokenizer(path string) (*Tokenizer, error) {
	f, err := parseGGUF(path)
	if err != nil {
		return nil, fmt.Errorf("model: %s: reading GGUF (truncated or corrupt file?): %w", path, err)
	}
	spec, err := ggufTokenizerSpec(path, f.Header.MetadataKV)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return NewTokenizer(spec)
}

// ggufTokenizerSpec is TokenizerSpecFromGGUF with the token texts and the
// chat template as the file stores them (the parser trims white space
// from strings; ggufraw.go).
func ggufTokenizerSpec(path string, kvs gguf.GGUFMetadataKVs) (TokenizerSpec, error) {
	spec, err := TokenizerSpecFromGGUF(kvs)
	if err != nil {
		return spec, err
	}
	raw, err := ggufRawStrings(path, "tokenizer.ggml.tokens", "tokenizer.chat_template")
	if err != nil {
		return spec, fmt.Errorf("re-reading the vocabulary: %w", err)
	}
	if toks, ok := raw["tokenizer.ggml.tokens"]; ok {
		if len(toks) != len(spec.Tokens) {
			return spec, fmt.Errorf("tokenizer.ggml.tokens: %d tokens re-read, %d parsed", len(toks), len(spec.Tokens))
		}
		spec.Tokens = toks
	}
	if tmpl, ok := raw["tokenizer.chat_template"]; ok && len(tmpl) == 1 {
		spec.ChatTemplate = tmpl[0]
	}
	return spec, nil
}

func ggufString(kvs gguf.GGUFMetadataKVs, key string, required bool) (string, error) {
	kv, ok := kvs.Get(key)
	if !ok {
		if required {
			return "", fmt.Errorf("model: GGUF key %s is missing", key)
		}
		return "", nil
	}
	if kv.ValueType != gguf.GGUFMetadataValueTypeString {
		return "", fmt.Errorf("model: GGUF key %s has type %v, want string", key, kv.ValueType)
	}
	return kv.ValueString(), nil
}

func ggufStrings(kvs gguf.GGUFMetadataKVs, key string, required bool) ([]string, error) {
	kv, ok := kvs.Get(key)
	if !ok {
		if required {
			return nil, fmt.Errorf("model: GGUF key %s is missing", key)
		}
		return nil, nil
	}
	if kv.ValueType != gguf.GGUFMetadataValueTypeArray {
		return nil, fmt.Errorf("model: GGUF key %s has type %v, want array of string", key, kv.ValueType)
	}
	av := kv.ValueArray()
	if av.Type != gguf.GGUFMetadataValueTypeString {
		return nil, fmt.Errorf("model: GGUF key %s is an array of %v, want string", key, av.Type)
	}
	if uint64(len(av.Array)) != av.Len {
		return nil, fmt.Errorf("model: GGUF key %s has %d of %d values loaded (parsed with SkipLargeMetadata?)", key, len(av.Array), av.Len)
	}
	if required && av.Len == 0 {
		return nil, fmt.Errorf("model: GGUF key %s is empty", key)
	}
	return av.ValuesString(), nil
}

// ggufFloats reads a numeric array of n values (a SentencePiece
// vocabulary's scores).
func ggufFloats(kvs gguf.GGUFMetadataKVs, key string, n int) ([]float32, error) {
	kv, ok := kvs.Get(key)
	if !ok {
		return nil, fmt.Errorf("model: GGUF key %s is missing (a SentencePiece vocabulary ranks its merges by it)", key)
	}
	if kv.ValueType != gguf.GGUFMetadataValueTypeArray {
		return nil, fmt.Errorf("model: GGUF key %s has type %v, want array of float32", key, kv.ValueType)
	}
	av := kv.ValueArray()
	if !av.Type.IsNumeric() || uint64(len(av.Array)) != av.Len {
		return nil, fmt.Errorf("model: GGUF key %s is an array of %v with %d of %d values loaded", key, av.Type, len(av.Array), av.Len)
	}
	if int(av.Len) != n {
		return nil, fmt.Errorf("model: GGUF key %s has %d entries for %d tokens", key, av.Len, n)
	}
	out := make([]float32, n)
	for i, v := range av.Array {
		switch x := v.(type) {
		case float32:
			out[i] = x
		case float64:
			out[i] = float32(x)
		default:
			out[i] = float32(toInt64(v))
		}
		if math.IsNaN(float64(out[i])) {
			return nil, fmt.Errorf("model: GGUF key %s: score %d is NaN", key, i)
		}
	}
	return out, nil
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case uint8:
		return int64(x)
	case int16:
		return int64(x)
	case uint16:
		return int64(x)
	case int32:
		return int64(x)
	case uint32:
		return int64(x)
	case int64:
		return x
	case uint64:
		return int64(x)
	case float32:
		return int64(x)
	case float64:
		return int64(x)
	case int:
		return int64(x)
	}
	return 0
}
