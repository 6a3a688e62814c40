package model

import gguf "github.com/gpustack/gguf-parser-go"

// Temporary until the tokenizer lands.
type Tokenizer struct{ n int }
type TokenizerSpec struct{ Tokens []string }

func TokenizerSpecFromGGUF(kvs gguf.GGUFMetadataKVs) (TokenizerSpec, error) {
	v, _ := kvs.Get("tokenizer.ggml.tokens")
	return TokenizerSpec{Tokens: v.ValueArray().ValuesString()}, nil
}
func NewTokenizer(s TokenizerSpec) (*Tokenizer, error)  { return &Tokenizer{len(s.Tokens)}, nil }
func LoadHFTokenizer(dir string) (*Tokenizer, error)    { return nil, nil }
func (t *Tokenizer) VocabSize() int                     { return t.n }
