package model

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	// A SentencePiece vocabulary (scores, byte tokens, whitespace tokens).
	if spm, err := os.ReadFile(filepath.Join(spmFixture, "spm-llama.gguf")); err == nil {
		f.Add(spm[:min(len(spm), 40<<10)])
	}
	// Fused projections (phi3) and K-quant super-blocks.
	// Gemma 3 (sliding windows, local and linear RoPE) likewise.
	for _, p := range []string{filepath.Join("..", "tests", "testdata", "moe", "phi3.gguf"), filepath.Join(kquantFixture, "kquant-types.gguf"),
		filepath.Join("..", "tests", "testdata", "moe", "gemma3.gguf"), filepath.Join("..", "tests", "testdata", "moe", "glm4moe.gguf")} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b[:min(len(b), 64<<10)])
		}
	}
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
	// SentencePiece forms (byte_fallback): Llama 2's and Mistral's.
	for _, form := range []string{"hf-llama2", "hf-mistral"} {
		if b, err := os.ReadFile(filepath.Join(spmFixture, form, "tokenizer.json")); err == nil {
			f.Add(b)
		}
	}
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

// FuzzHFConfig: a Hugging Face directory whose config.json is anything
// (the tiny model's weights beside it) loads or is refused with an error
// naming the file; the loader never panics on a shape the weights cannot
// have (zero heads, a head dimension that does not divide, a huge vocabulary,
// an MoE or latent-attention block of nonsense).
func FuzzHFConfig(f *testing.F) {
	for _, c := range []string{
		`{"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"head_dim":16,"vocab_size":300,"rope_theta":10000,"rms_norm_eps":1e-5,` +
			`"tie_word_embeddings":false,"max_position_embeddings":128,"hidden_act":"silu","rope_scaling":null}`,
		`{"model_type":"qwen3_moe","hidden_size":64,"intermediate_size":96,"moe_intermediate_size":32,"num_hidden_layers":3,` +
			`"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"vocab_size":300,"num_experts":4,` +
			`"num_experts_per_tok":2,"norm_topk_prob":true}`,
		`{"model_type":"mixtral","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"num_local_experts":4,"num_experts_per_tok":2}`,
		`{"model_type":"deepseek_v3","hidden_size":64,"intermediate_size":96,"moe_intermediate_size":32,"num_hidden_layers":3,` +
			`"num_attention_heads":4,"vocab_size":300,"q_lora_rank":24,"kv_lora_rank":16,"qk_nope_head_dim":8,` +
			`"qk_rope_head_dim":8,"v_head_dim":8,"n_routed_experts":4,"n_shared_experts":1,"num_experts_per_tok":2,` +
			`"first_k_dense_replace":1,"scoring_func":"sigmoid","topk_method":"noaux_tc","n_group":2,"topk_group":1,` +
			`"norm_topk_prob":true,"routed_scaling_factor":2.5,"rope_scaling":{"type":"yarn","factor":4,` +
			`"original_max_position_embeddings":64}}`,
		`{"model_type":"qwen2","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"use_sliding_window":false,"sliding_window":4096}`,
		`{"model_type":"phi3","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"sliding_window":null,"partial_rotary_factor":1.0}`,
		`{"model_type":"mistral","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"head_dim":32,"vocab_size":300,"sliding_window":128,"max_position_embeddings":128}`,
		`{"model_type":"gemma2","hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"hidden_activation":"gelu_pytorch_tanh","query_pre_attn_scalar":16,` +
			`"attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,"sliding_window":8,"layer_types":["sliding_attention","full_attention"]}`,
		`{"model_type":"gemma3_text","hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"sliding_window":8,"sliding_window_pattern":6,"rope_local_base_freq":10000,` +
			`"rope_scaling":{"rope_type":"linear","factor":8.0},"final_logit_softcapping":null}`,
		`{"model_type":"phi3","hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"partial_rotary_factor":0.75,"max_position_embeddings":128,` +
			`"original_max_position_embeddings":32,"rope_scaling":{"type":"longrope","long_factor":[1,2,3,4,5,6],"short_factor":[1,1,1,1,1,1]}}`,
		`{"model_type":"gemma3_text","hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"vocab_size":300,"sliding_window":8,"rope_parameters":{"full_attention":` +
			`{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":10000.0}}}`,
		`{"model_type":"gemma3","architectures":["Gemma3ForConditionalGeneration"],"text_config":{"model_type":"gemma3_text",` +
			`"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,` +
			`"head_dim":16,"vocab_size":300,"sliding_window":8},"vision_config":{"model_type":"siglip_vision_model"}}`,
		`{"model_type":"glm4_moe","hidden_size":64,"intermediate_size":96,"num_hidden_layers":3,"num_attention_heads":4,` +
			`"num_key_value_heads":2,"head_dim":32,"partial_rotary_factor":0.5,"vocab_size":300,"attention_bias":true,` +
			`"first_k_dense_replace":1,"n_routed_experts":4,"n_shared_experts":1,"num_experts_per_tok":2,"moe_intermediate_size":16,` +
			`"norm_topk_prob":true,"routed_scaling_factor":2.5,"n_group":1,"topk_group":1,"num_nextn_predict_layers":1}`,
	} {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, config []byte) {
		dir := writeHF(t, newTinyModel(3, false), hfOptions{shards: 1})
		if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := Load(dir); err == nil {
			m.Close()
		}
	})
}

// FuzzSafetensors: any bytes in a checkpoint's safetensors shards (a
// header whose length, offsets, shapes or dtypes lie, data cut off) or in
// its index load or are refused with an error; the loader never panics
// nor sizes a buffer by a length it read.
func FuzzSafetensors(f *testing.F) {
	dir := writeHF(f, newTinyModel(3, false), hfOptions{})
	shard, err := os.ReadFile(filepath.Join(dir, "model-00001-of-00002.safetensors"))
	if err != nil {
		f.Fatal(err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		f.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint64(shard))
	f.Add(shard, index)
	f.Add(shard[:8+n], index)
	f.Add(shard[:8+n+(len(shard)-8-n)/2], index)
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 1<<62), shard[8:]...), index)
	f.Add(shard, []byte(`{"weight_map":{"model.embed_tokens.weight":"../x.safetensors"}}`))
	f.Add([]byte(strings.Replace(string(shard), `"F32"`, `"F8_E4M3"`, 1)), index)
	f.Add([]byte(strings.Replace(string(shard), `"data_offsets":[0,`, `"data_offsets":[1,`, 1)), index)
	f.Fuzz(func(t *testing.T, data, idx []byte) {
		d := t.TempDir()
		for _, name := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "model-00002-of-00002.safetensors"} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "model-00001-of-00002.safetensors"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "model.safetensors.index.json"), idx, 0o644); err != nil {
			t.Fatal(err)
		}
		if m, err := Load(d); err == nil {
			m.Close()
		}
	})
}
