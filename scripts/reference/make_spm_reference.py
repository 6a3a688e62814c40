#!/usr/bin/env python3
"""make_spm_reference.py: llama.cpp reference of a SentencePiece ("llama") vocabulary.

Llama 1/2, Mistral 7B and Mixtral 8x7B GGUF files carry a SentencePiece
vocabulary (tokenizer.ggml.model "llama": pieces with scores, <0xXX> byte
tokens), not a byte-level BPE. No such model fits these machines, so this
script trains one with the `sentencepiece` package, the way Llama 2's was
trained (BPE, byte fallback, identity normalisation, a dummy prefix, digits
split, whitespace kept), on the license texts every Debian system has
(/usr/share/common-licenses), with two control symbols ([INST], [/INST]) and
a user-defined one. It converts the vocabulary as llama.cpp's
convert_hf_to_gguf.py does (_create_vocab_sentencepiece: the piece, its score,
and its type: unknown 2, control 3, unused 5, byte 6, else normal 1; an added
user-defined token 4), writes it with a tiny random-weight Llama (F32,
2 layers, hidden 32, tied embeddings) and runs llama.cpp (llama-cpp-python,
an implementation this project did not write) on it:

  tokenize  per case (text as UTF-8 hex, so that invalid UTF-8 can be
            stored; add_special; parse_special): llama.cpp's ids, and for
            plain text without special tokens the ids of sentencepiece itself
  pieces    per token id: llama.cpp's token_to_piece bytes (hex), with
            special false and true
  prompts   greedy continuations of a few prompts (BOS added), with the top-5
            logits and the top-1/top-2 gap at every step, as
            make_moe_reference.py records them

The same vocabulary also goes into Hugging Face tokenizer.json files, built
with the `tokenizers` library (the implementation transformers and vLLM use)
as the hub's files are: a BPE with byte_fallback whose merges are every split
of a piece into two pieces, ranked by the merged piece's score (as
transformers' SentencePieceExtractor orders them), with

  hf-llama2    Llama 2's: a Prepend("▁") + Replace(" ", "▁") normalizer
  hf-mistral   Mistral v0.3's: a Metaspace pre-tokenizer, prepend_scheme first
  hf-split     a Metaspace with prepend_scheme always and split on

and the tokenizers library's ids of every UTF-8 case (it always parses added
tokens) go into the reference as hf[variant].

Gemma's form (gemma()): a second vocabulary trained as Gemma's was (no dummy
prefix, byte fallback, Gemma's special-id order and user-defined pieces
<start_of_turn>, <end_of_turn>, <mask>, <unused0> and runs of newlines, spaces
and tabs), converted as convert_hf_to_gguf.py converts Gemma (the
tokenizer_config.json entries become control or user-defined tokens, the
latter with "▁" written as spaces; add_space_prefix false) into a
vocabulary-only spm-gemma.gguf, and as transformers converts it into
hf-gemma/ (the Hub files' form: a Replace(" ", "▁") normalizer, no
pre-tokenizer, merges by generate_merges over the scores) and
hf-gemma-transformers/ (what transformers' GemmaTokenizer writes itself from
the tokenizer.model: a Split at " " as pre-tokenizer, merges by id).
gemma.reference.json holds llama.cpp's ids (with and without BOS and
special-token parsing) and detokenized texts, sentencepiece's ids where they
are comparable, and per tokenizer.json the tokenizers library's ids
(encode_special_tokens = not parse_special) and decoded texts.

Writes tests/testdata/spm/spm-llama.gguf, hf-*/, spm.reference.json, spm-gemma.gguf and
gemma.reference.json (or --out-dir).
Usage: see scripts/reference/README.md ("SentencePiece vocabulary").
"""

import argparse
import glob
import importlib.metadata
import io
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_reference import STEPS, continuations  # noqa: E402

VOCAB = 1000
SEED = 33001
USER_DEFINED = "<|tool|>"

TOKENIZE = [
    "Hello world",
    "Hello  world",
    " leading space",
    "trailing space ",
    "   ",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>",
    "line one\nline two\n\n\tindented",
    "1234567890 and 3.14159",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "日本語のテキスト",
    "emoji: 🦙🔥 done",
    "mixed\r\nline endings\r",
    "[INST] What is the GNU General Public License? [/INST]",
    "<s>[INST] Hi [/INST] Hello</s>",
    "call " + USER_DEFINED + " now",
    USER_DEFINED + USER_DEFINED,
    "[INST][/INST]",
    "a" * 40 + " " + "b" * 3,
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software",
]
INVALID_UTF8 = [b"\xff\xfe bytes", b"trunc \xe6\x97", b"\xc3a stray", b"\x80\x80"]

PROMPTS = [
    ("license", "This program is free software; you can redistribute it"),
    ("inst", "[INST] What does the license allow? [/INST]"),
    ("numbers", "1, 2, 3, 4, 5,"),
    ("german", "Zwölf Boxkämpfer jagen Viktor"),
    ("single", "x"),
]


def corpus():
    texts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.extend(line.rstrip("\n") for line in f if line.strip())
    if not texts:
        sys.exit("no corpus: /usr/share/common-licenses is empty")
    return texts


def train():
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="bpe", vocab_size=VOCAB,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, control_symbols=["[INST]", "[/INST]"], num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def vocab(sp):
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        t = 1
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        types.append(t)
    # An added token (added_tokens.json in a Hugging Face directory): user-defined.
    tokens.append(USER_DEFINED)
    scores.append(-1000.0)
    types.append(4)
    return tokens, scores, types


def write_gguf(path, tokens, scores, types):
    import gguf
    rng = np.random.default_rng(SEED)
    V, H, L, NH, NKV, FF = len(tokens), 32, 2, 4, 2, 64
    D = H // NH
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("spm-llama")
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                        "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}"
                        "{% endif %}{% endfor %}")

    def mat(rows, cols, scale=None):
        s = 1.0 / np.sqrt(cols) if scale is None else scale
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def gain(n):
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    # Tied: token_embd is also the output matrix; logits spread over units.
    w.add_tensor("token_embd.weight", mat(V, H, 3.0 / np.sqrt(H)))
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", gain(H))
        w.add_tensor(p + "attn_q.weight", mat(NH * D, H))
        w.add_tensor(p + "attn_k.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_v.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_output.weight", mat(H, NH * D))
        w.add_tensor(p + "ffn_norm.weight", gain(H))
        w.add_tensor(p + "ffn_gate.weight", mat(FF, H))
        w.add_tensor(p + "ffn_up.weight", mat(FF, H))
        w.add_tensor(p + "ffn_down.weight", mat(H, FF))
    w.add_tensor("output_norm.weight", gain(H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_variants(sp, tokens, types, out_dir):
    """Writes the tokenizer.json directories; returns {variant: tokenizers.Tokenizer}."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    vocab = {t: i for i, t in enumerate(tokens) if types[i] != 4}
    normal = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    ranked = []
    for t, i in normal.items():
        for k in range(1, len(t)):
            if t[:k] in normal and t[k:] in normal:
                ranked.append((i, normal[t[:k]], normal[t[k:]], t[:k], t[k:]))
    merges = [(a, b) for _, _, _, a, b in sorted(ranked)]
    out = {}
    for name in ("hf-llama2", "hf-mistral", "hf-split"):
        tok = Tokenizer(BPE(vocab=dict(vocab), merges=list(merges), unk_token="<unk>", fuse_unk=True,
                            byte_fallback=True, dropout=None))
        if name == "hf-llama2":
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(
                replacement="▁", prepend_scheme="first" if name == "hf-mistral" else "always", split=name == "hf-split")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>", "[INST]", "[/INST]")])
        tok.add_tokens([AddedToken(USER_DEFINED, special=False, normalized=False)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                       "add_eos_token": False}, f, indent=1)
            f.write("\n")
        out[name] = tok
    return out


def piece(llm, tid, special):
    import ctypes
    import llama_cpp
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(llm._model.vocab, tid, buf, len(buf), 0, special)
    return buf.raw[:n]


# Gemma (Gemma 1, 2 and 3 share the form): a SentencePiece BPE without a dummy
# prefix, with byte fallback, whose tokenizer.model holds user-defined pieces
# (<start_of_turn>, <end_of_turn>, <mask>, <unusedN>, runs of newlines, spaces
# and tabs, HTML tags) that it always emits whole.

GEMMA_VOCAB = 1000
GEMMA_USER_DEFINED = ["<mask>", "[multimodal]", "<unused0>", "<start_of_turn>", "<end_of_turn>",
                      "\n", "\n\n", "\n\n\n", "▁▁", "▁▁▁", "▁▁▁▁", "\t", "\t\t", "<table>", "<tr>"]
# transformers' GemmaConverter marks these two special beside the control pieces.
GEMMA_TURN = ("<start_of_turn>", "<end_of_turn>")

GEMMA_TOKENIZE = [
    "Hello world",
    "Hello  world",
    "Hello   world",
    "x     y",
    "x         y",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    " ",
    "   ",
    "",
    "line one\nline two\n\n\tindented",
    "\n",
    "\n\n\n\n\n",
    "a\n \n  b",
    "tab\t\tx\t\t\ty",
    " \t \n",
    "mixed\r\nline endings\r",
    "def f(x):\n    return x  # comment\n",
    "The quick brown fox jumps over the lazy dog.",
    "Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>",
    "1234567890 and 3.14159",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "日本語のテキスト",
    "emoji: 🦙🔥 done",
    "🦙",
    "\u00a0no-break and\u3000ideographic spaces",
    "literal ▁ and ▁▁ lower blocks",
    "<start_of_turn>user\nWhat is the GNU General Public License?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
    " <start_of_turn> spaced <end_of_turn> ",
    "<start_of_turn><end_of_turn>",
    "text<start_of_turn>  two spaces after",
    "<mask> and [multimodal] and <unused0>",
    "<table><tr> cell\n\n\n\n",
    "<pad><eos><unk>",
    "a" * 40 + " " + "b" * 3,
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software",
]


def gemma_train():
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="bpe", vocab_size=GEMMA_VOCAB,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, user_defined_symbols=GEMMA_USER_DEFINED, num_threads=1,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", minloglevel=2)
    return model.getvalue()


def gemma_config(proto):
    """tokenizer_config.json as Gemma's: every control, unknown and user-defined piece in
    added_tokens_decoder, special as GemmaConverter marks them."""
    dec = {}
    for i, p in enumerate(proto.pieces):
        if p.type in (2, 3, 4):
            dec[str(i)] = {"content": p.piece, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": p.type in (2, 3) or p.piece in GEMMA_TURN}
    return {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": dec,
            "additional_special_tokens": list(GEMMA_TURN), "bos_token": "<bos>",
            "clean_up_tokenization_spaces": False, "eos_token": "<eos>", "pad_token": "<pad>",
            "sp_model_kwargs": {}, "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer",
            "unk_token": "<unk>", "use_default_system_prompt": False}


def gemma_looks_special(text):
    # convert_hf_to_gguf.py's does_token_look_special
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or text.startswith("<|") and text.endswith("|>")
            or text.startswith("<｜") and text.endswith("｜>") or text.startswith("<unused") and text.endswith(">"))


def gemma_gguf_vocab(proto, config):
    """The vocabulary as convert_hf_to_gguf.py's _create_vocab_sentencepiece writes it: the
    pieces by sentencepiece's type (a user-defined piece comes out normal), then every entry of
    added_tokens_decoder: control if special or special-looking, else user-defined with its
    "▁" turned into spaces; score -1000."""
    tokens, scores, types = [], [], []
    for p in proto.pieces:
        tokens.append(p.piece)
        scores.append(p.score)
        types.append({2: 2, 3: 3, 5: 5, 6: 6}.get(p.type, 1))
    for key, t in config["added_tokens_decoder"].items():
        i, text = int(key), t["content"]
        if t["special"] or gemma_looks_special(text):
            types[i] = 3
        else:
            text = text.replace("▁", " ")
            types[i] = 4
        tokens[i], scores[i] = text, -1000.0
    return tokens, scores, types


def write_gemma_gguf(path, tokens, scores, types, eot):
    """A vocabulary-only Gemma GGUF (the hyperparameters llama.cpp reads, no tensors)."""
    import gguf
    w = gguf.GGUFWriter(path, "gemma")
    w.add_name("spm-gemma")
    w.add_context_length(8192)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_eot_token_id(eot)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma_config(d, config):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")


def gemma_hf_hub(proto, config, d):
    """tokenizer.json in the form of the Hub's Gemma files, built as transformers' GemmaConverter
    built them: every piece in a byte-fallback BPE, merges from generate_merges ordered by the
    pieces' scores, a Replace(" ", "▁") normalizer, no pre-tokenizer, the control and
    user-defined pieces as added tokens (normalized false)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers.tokenization_utils_base import generate_merges
    vocab_scores = [(p.piece, p.score) for p in proto.pieces]
    vocab = {piece: i for i, (piece, _) in enumerate(vocab_scores)}
    merges = generate_merges(vocab, vocab_scores)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True,
                        dropout=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    for key, t in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0])):
        at = AddedToken(t["content"], special=t["special"], normalized=False)
        if t["special"]:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", 2)])
    write_gemma_config(d, config)
    tok.save(os.path.join(d, "tokenizer.json"))
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def gemma_hf_transformers(model_bytes, config, d):
    """tokenizer.json as transformers itself writes it from the tokenizer.model and
    tokenizer_config.json (GemmaTokenizer.from_pretrained, save_pretrained)."""
    import shutil
    import tempfile
    from tokenizers import Tokenizer
    from transformers import GemmaTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        write_gemma_config(src, config)
        with open(os.path.join(src, "tokenizer.model"), "wb") as f:
            f.write(model_bytes)
        GemmaTokenizer.from_pretrained(src).save_pretrained(dst)
        write_gemma_config(d, config)
        shutil.copyfile(os.path.join(dst, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def gemma(out_dir):
    """Writes spm-gemma.gguf, hf-gemma/, hf-gemma-transformers/ and gemma.reference.json."""
    import ctypes
    import llama_cpp
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    model_bytes = gemma_train()
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    config = gemma_config(proto)
    tokens, scores, types = gemma_gguf_vocab(proto, config)
    path = os.path.join(out_dir, "spm-gemma.gguf")
    write_gemma_gguf(path, tokens, scores, types, tokens.index("<end_of_turn>"))
    hf = {"hf-gemma": gemma_hf_hub(proto, config, os.path.join(out_dir, "hf-gemma")),
          "hf-gemma-transformers": gemma_hf_transformers(model_bytes, config,
                                                         os.path.join(out_dir, "hf-gemma-transformers"))}
    print(f"wrote {path}: {len(tokens)} tokens", file=sys.stderr)

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab

    def detokenize(ids, unparse_special):
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        buf = ctypes.create_string_buffer(1 << 14)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, unparse_special)
        assert n >= 0
        return buf.raw[:n]

    # sentencepiece matches its user-defined pieces always and its control pieces never, llama.cpp
    # the GGUF's user-defined tokens always and its control ones with parse_special: the two are
    # compared with parse_special on texts that hold no control piece.
    controls = [p.piece for p in proto.pieces if p.type in (2, 3)]
    cases, differ = [], 0
    for raw in [t.encode("utf-8") for t in GEMMA_TOKENIZE] + INVALID_UTF8:
        text = raw.decode("utf-8") if raw not in INVALID_UTF8 else None
        for add_special in (False, True):
            for parse_special in (False, True):
                ids = [int(i) for i in llm.tokenize(raw, add_bos=add_special, special=parse_special)]
                case = {"text_hex": raw.hex(), "add_special": add_special, "parse_special": parse_special,
                        "ids": ids, "decoded": detokenize(ids, False).hex(),
                        "decoded_special": detokenize(ids, True).hex()}
                if text is not None and parse_special and not add_special and not any(c in text for c in controls):
                    case["sentencepiece_ids"] = sp.encode(text)
                    if case["sentencepiece_ids"] != ids:
                        differ += 1
                        print(f"  sentencepiece differs from llama.cpp on {text!r}", file=sys.stderr)
                if text is not None:
                    case["hf"] = {}
                    for name, tok in hf.items():
                        tok.encode_special_tokens = not parse_special
                        enc = tok.encode(text, add_special_tokens=add_special).ids
                        tok.encode_special_tokens = False
                        case["hf"][name] = {"ids": enc, "decoded": tok.decode(enc, skip_special_tokens=True),
                                            "decoded_special": tok.decode(enc, skip_special_tokens=False)}
                        if name == "hf-gemma" and enc != ids:
                            print(f"  {name} differs from llama.cpp on {text!r} (add_special {add_special}, "
                                  f"parse_special {parse_special})", file=sys.stderr)
                cases.append(case)
    pieces = [{"plain": piece(llm, i, False).hex(), "special": piece(llm, i, True).hex()}
              for i in range(len(tokens))]
    ref = {
        "model": "spm-gemma.gguf",
        "hf_dirs": sorted(hf),
        "tools": {"llama_cpp_python": llama_cpp.__version__, "gguf": importlib.metadata.version("gguf"),
                  "sentencepiece": importlib.metadata.version("sentencepiece"),
                  "tokenizers": importlib.metadata.version("tokenizers"),
                  "transformers": importlib.metadata.version("transformers")},
        "conventions": {
            "text_hex": "the text's bytes in hex (some are not UTF-8)",
            "ids": "llama.cpp's llama_tokenize(text, add_special, parse_special) on spm-gemma.gguf",
            "decoded": "llama_detokenize(ids, remove_special false, unparse_special false), hex",
            "decoded_special": "llama_detokenize(ids, remove_special false, unparse_special true), hex",
            "sentencepiece_ids": "SentencePieceProcessor.encode(text) of the trained model; only with parse_special, without add_special, on UTF-8 texts that hold no control piece",
            "hf": "per tokenizer.json directory, for the UTF-8 texts: tokenizers' Tokenizer.encode(text, add_special_tokens=add_special) with encode_special_tokens = not parse_special (special added tokens are then text, the others still matched), and decode(ids, skip_special_tokens true / false)",
            "pieces": "llama_token_to_piece(id, lstrip 0, special false / true), hex",
        },
        "tokenize": cases,
        "pieces": pieces,
    }
    with open(os.path.join(out_dir, "gemma.reference.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"gemma: {len(cases)} cases, sentencepiece differs on {differ}", file=sys.stderr)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(root, "tests", "testdata", "spm"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    import llama_cpp
    sp = train()
    tokens, scores, types = vocab(sp)
    path = os.path.join(args.out_dir, "spm-llama.gguf")
    write_gguf(path, tokens, scores, types)
    hf = hf_variants(sp, tokens, types, args.out_dir)
    print(f"wrote {path}: {len(tokens)} tokens", file=sys.stderr)

    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=512, n_threads=2, n_threads_batch=2,
                          seed=0, verbose=False, type_k=0, type_v=0, flash_attn=False)
    cases = []
    for raw in [t.encode("utf-8") for t in TOKENIZE] + INVALID_UTF8:
        for add_special in (False, True):
            for parse_special in (False, True):
                ids = llm.tokenize(raw, add_bos=add_special, special=parse_special)
                case = {"text_hex": raw.hex(), "add_special": add_special, "parse_special": parse_special,
                        "ids": [int(i) for i in ids]}
                text = raw.decode("utf-8", errors="strict") if raw not in INVALID_UTF8 else None
                if text is not None and not add_special and not parse_special and "[" not in text and \
                        USER_DEFINED not in text and "<s>" not in text:
                    case["sentencepiece_ids"] = sp.encode(text)
                    if case["sentencepiece_ids"] != case["ids"]:
                        print(f"  sentencepiece differs on {text!r}", file=sys.stderr)
                cases.append(case)
    hf_ids = {name: [] for name in hf}
    for c in cases:
        raw = bytes.fromhex(c["text_hex"])
        for name, tok in hf.items():
            ok = c["parse_special"] and raw not in INVALID_UTF8
            hf_ids[name].append(tok.encode(raw.decode("utf-8"), add_special_tokens=c["add_special"]).ids if ok else None)
    pieces = [{"plain": piece(llm, i, False).hex(), "special": piece(llm, i, True).hex()}
              for i in range(len(tokens))]

    prompts = continuations(llm, PROMPTS, add_bos=True, special=True)

    ref = {
        "model": "spm-llama.gguf",
        "architecture": "llama",
        "steps": STEPS,
        "tools": {"llama_cpp_python": llama_cpp.__version__, "gguf": importlib.metadata.version("gguf"),
                  "sentencepiece": importlib.metadata.version("sentencepiece"),
                  "tokenizers": importlib.metadata.version("tokenizers"), "numpy": np.__version__},
        "conventions": {
            "text_hex": "the text's bytes in hex (some are not UTF-8)",
            "ids": "llama.cpp's llama_tokenize(text, add_special, parse_special)",
            "sentencepiece_ids": "SentencePieceProcessor.encode(text), plain text only",
            "hf": "per tokenizer.json directory, tokenizers' Tokenizer.encode(text, add_special_tokens).ids for the UTF-8 cases with parse_special (the library parses added tokens always); null for the others",
            "pieces": "llama_token_to_piece(id, lstrip 0, special false / true), hex",
            "step": "step 0 = logits after the prompt's last token; step k = after feeding greedy token k-1",
            "top": "the 5 largest logits as [token, logit], descending (ties: lower id)",
            "gap": "top-1 logit minus top-2 logit",
        },
        "tokenize": cases,
        "hf": hf_ids,
        "pieces": pieces,
        "prompts": prompts,
    }
    with open(os.path.join(args.out_dir, "spm.reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    gemma(args.out_dir)


if __name__ == "__main__":
    main()
