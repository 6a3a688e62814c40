package model

import (
	"strings"
	"testing"

	gguf "github.com/gpustack/gguf-parser-go"
)

func kvString(k, v string) gguf.GGUFMetadataKV {
	return gguf.GGUFMetadataKV{Key: k, ValueType: gguf.GGUFMetadataValueTypeString, Value: v}
}

func kvArray(k string, typ gguf.GGUFMetadataValueType, vals ...any) gguf.GGUFMetadataKV {
	return gguf.GGUFMetadataKV{Key: k, ValueType: gguf.GGUFMetadataValueTypeArray,
		Value: gguf.GGUFMetadataKVArrayValue{Type: typ, Len: uint64(len(vals)), Array: vals}}
}

func tinyKVs() gguf.GGUFMetadataKVs {
	toks := []any{"a", "b", "ab", "<|end|>"}
	return gguf.GGUFMetadataKVs{
		kvString("tokenizer.ggml.model", "gpt2"),
		kvString("tokenizer.ggml.pre", "llama-bpe"),
		kvArray("tokenizer.ggml.tokens", gguf.GGUFMetadataValueTypeString, toks...),
		kvArray("tokenizer.ggml.token_type", gguf.GGUFMetadataValueTypeInt32, int32(1), int32(1), int32(1), int32(3)),
		kvArray("tokenizer.ggml.merges", gguf.GGUFMetadataValueTypeString, "a b"),
		{Key: "tokenizer.ggml.eos_token_id", ValueType: gguf.GGUFMetadataValueTypeUint32, Value: uint32(3)},
		{Key: "tokenizer.ggml.add_bos_token", ValueType: gguf.GGUFMetadataValueTypeBool, Value: false},
		kvString("tokenizer.chat_template", "{{ messages }}"),
	}
}

func TestTokenizerSpecFromGGUF(t *testing.T) {
	spec, err := TokenizerSpecFromGGUF(tinyKVs())
	if err != nil {
		t.Fatal(err)
	}
	if spec.Model != "gpt2" || spec.Pre != "llama-bpe" || len(spec.Tokens) != 4 || spec.TokenTypes[3] != TokenControl ||
		len(spec.Merges) != 1 || spec.EOS != 3 || spec.BOS != -1 || spec.UNK != -1 || spec.EOT != -1 || spec.ChatTemplate == "" {
		t.Fatalf("spec %+v", spec)
	}
	tok, err := NewTokenizer(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("ab<|end|>", EncodeOptions{ParseSpecial: true}); len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("Encode %v", got)
	}

	for _, c := range []struct {
		name   string
		mutate func(gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs
		want   string
	}{
		{"no model", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs { return k[1:] }, "tokenizer.ggml.model"},
		{"no tokens", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs { return append(k[:2:2], k[3:]...) }, "tokenizer.ggml.tokens"},
		{"tokens not strings", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[2] = kvArray("tokenizer.ggml.tokens", gguf.GGUFMetadataValueTypeInt32, int32(1))
			return k
		}, "tokenizer.ggml.tokens"},
		{"tokens skipped", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[2] = gguf.GGUFMetadataKV{Key: "tokenizer.ggml.tokens", ValueType: gguf.GGUFMetadataValueTypeArray,
				Value: gguf.GGUFMetadataKVArrayValue{Type: gguf.GGUFMetadataValueTypeString, Len: 4}}
			return k
		}, "tokenizer.ggml.tokens"},
		{"types short", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[3] = kvArray("tokenizer.ggml.token_type", gguf.GGUFMetadataValueTypeInt32, int32(1))
			return k
		}, "tokenizer.ggml.token_type"},
		{"eos out of range", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[5].Value = uint32(99)
			return k
		}, "tokenizer.ggml.eos_token_id"},
		{"eos not a number", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[5] = kvString("tokenizer.ggml.eos_token_id", "2")
			return k
		}, "tokenizer.ggml.eos_token_id"},
		{"add_bos not bool", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[6] = kvString("tokenizer.ggml.add_bos_token", "yes")
			return k
		}, "tokenizer.ggml.add_bos_token"},
		{"pre not string", func(k gguf.GGUFMetadataKVs) gguf.GGUFMetadataKVs {
			k[1] = gguf.GGUFMetadataKV{Key: "tokenizer.ggml.pre", ValueType: gguf.GGUFMetadataValueTypeUint32, Value: uint32(1)}
			return k
		}, "tokenizer.ggml.pre"},
	} {
		_, err := TokenizerSpecFromGGUF(c.mutate(tinyKVs()))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to name %s", c.name, err, c.want)
		}
	}
}
