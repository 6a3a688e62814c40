#!/usr/bin/env python3
"""tokenizer_reference.py: reference token ids and chat renders for package model.

Writes, for the SmolLM2-135M-Instruct GGUF (scripts/fetch-model.sh):

  model/testdata/smollm2/tokenizer_cases.jsonl   {"text", "ids"[, "parse_special": true]}
  model/testdata/smollm2/chat_cases.jsonl        {"messages", "add_generation_prompt", "text", "ids"}
  model/testdata/smollm2/tokenizer_versions.json tool versions, counts, cross-check results
  model/testdata/pretok_cases.jsonl              {"pre", "text", "pieces"}: the split regexes
                                                 (GPT-2, Llama-3, Qwen2, DeepSeek-V3) run by
                                                 tokenizers' Split

The reference tokenizer is the HF `tokenizers` library (Rust) configured the
way SmolLM2's published tokenizer.json is: BPE over the GGUF's vocabulary and
merges, pre-tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)], ByteLevel decoder, the
GGUF's control tokens as special added tokens. llama.cpp reads
tokenizer.ggml.pre = "smollm" the same way (a \\p{N} split, then the GPT-2
regex). As a cross-check the script also builds the tokenizer through
transformers' own GGUF converter (which has no "smollm" entry and so omits the
digit split) and records how many cases agree.

Chat renders come from transformers' apply_chat_template(tokenize=False) with
the GGUF's chat template; no torch is needed.

Usage: python3 scripts/reference/tokenizer_reference.py [path/to/model.gguf]
       python3 scripts/reference/tokenizer_reference.py --pretok-only   (pretok_cases.jsonl only; no model)
Needs: pip install gguf transformers tokenizers jinja2
"""
import importlib.metadata
import json
import os
import random
import sys

import gguf
import jinja2
import tokenizers
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "model", "testdata", "smollm2")
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path():
    if len(sys.argv) > 1:
        return sys.argv[1]
    cache = os.environ.get("LOCKSTEP_MODEL_CACHE", os.path.expanduser("~/.cache/lockstep/models"))
    return os.path.join(cache, NAME)


def read_meta(path):
    r = gguf.GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.") or k == "general.architecture":
            meta[k] = f.contents()
    return meta


def build_reference(meta):
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def build_transformers_gguf(meta):
    """transformers' GGUF converter, fed by the gguf reader (its own reader needs torch)."""
    from transformers.integrations.gguf import gguf_tokenizer_mapping as m
    d = {
        "tokenizer_type": meta["tokenizer.ggml.model"],
        "pre_tokenizer_type": meta["tokenizer.ggml.pre"],
        "tokens": meta["tokenizer.ggml.tokens"],
        "token_type": meta["tokenizer.ggml.token_type"],
        "merges": meta["tokenizer.ggml.merges"],
    }
    backend, _ = m.convert_gguf_tokenizer(meta["general.architecture"], d)
    return backend


# ---------------------------------------------------------------- case generation

PROSE = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "I can't believe it's not butter.", "They're here; we've seen them, and you'll see.",
    "HE'S GONE. SHE'LL COME. THEY'RE OK. I'M FINE. WE'VE WON. YOU'D KNOW.",
    "What's up?", "It's 5 o'clock somewhere.", "Dr. Smith's cat's toy.",
    "rock 'n' roll", "'quoted' and \"double quoted\"", "A sentence.  Two spaces after.",
    "Line one\nLine two\n\nLine four", "Windows\r\nline\r\nendings\r\n", "tabs\tin\tthe\ttext",
    "trailing spaces   ", "   leading spaces", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ",
    "e-mail: someone@example.com", "URL: https://example.com/path?q=1&r=two#frag",
    "C'est la vie, n'est-ce pas ?", "Ünïcödé façade naïve résumé coöperate",
    "Straße, Größe, Äpfel und Öl", "Tiếng Việt có dấu: Xin chào, cảm ơn bạn rất nhiều.",
    "Привет, как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "こんにちは世界", "你好，世界！", "안녕하세요 세계", "ภาษาไทย", "Ελληνικά και English mixed",
    "emoji 😀😃😄 test", "family 👨‍👩‍👧‍👦 zwj", "flags 🇫🇷🇩🇪🇯🇵", "thumbs 👍🏽 skin",
    "heart ❤️ variation", "keycap 1️⃣ #️⃣", "math ∑∫√∞ ≤ ≥ ≠", "arrows ← → ↑ ↓",
    "½ ¼ ¾ ² ³ Ⅻ ⅷ", "full-width ＡＢＣ１２３", "...", "!!!???", "---===***", "()[]{}<>",
    "a.b,c;d:e!f?g", "#include <stdio.h>", "x += 1; y -= 2;", "$100.00 €50 £20 ¥1000",
    "3.14159265358979", "1,000,000", "2024-01-15T10:30:00Z", "v1.2.3-beta+build.45",
    "0x1F 0b1010 0o777 1e-10", "phone: +1 (555) 123-4567",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Foo:\n    def __init__(self):\n        self.x = 1\n\n    def bar(self):\n        pass\n",
    "for i in range(10):\n\tprint(i)\n",
    "if x == 1:\n        y = 2  # comment\n    else:\n        y = 3\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
    "func (t *Tokenizer) Encode(s string) []int32 {\n\tif s == \"\" {\n\t\treturn nil\n\t}\n\treturn t.enc(s)\n}\n",
    "{\n  \"name\": \"lockstep\",\n  \"version\": 3,\n  \"tags\": [\"a\", \"b\"],\n  \"nested\": {\"x\": null, \"y\": true}\n}",
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "<div class=\"main\"><p>Hi</p></div>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\"\ndone\n",
    "    \n    \n", "\t\t\tx\t\t\n", "int main(void) { return 0; }\r\n",
    "a = [x**2 for x in range(100) if x % 3 == 0]",
    "// TODO(alice): fix this\n/* block\n   comment */",
    "```python\nprint('hi')\n```", "| col1 | col2 |\n|------|------|\n| 1    | 2    |",
    "key: value\nlist:\n  - one\n  - two\n", "x=1;y=2;z=x+y",
]

WORDS = ("the of and to in is was for on that with as by at from it this be are or have an not "
         "model token serving queue batch GPU kernel latency throughput request stream decode "
         "encode merge rank byte unicode café naïve über straße 東京 北京 서울 Москва "
         "I'm you're we've they'll she'd it's isn't don't CAN'T WON'T").split()

SEPS = [" ", "  ", "\t", "\n", ", ", ". ", "! ", "? ", " - ", "\r\n", "   ", " \n", "\n\n", "; ", ": "]

BLOCKS = [
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x180, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1E00, 0x1EFF),
    (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20CF), (0x2100, 0x218F), (0x2190, 0x21FF),
    (0x2200, 0x22FF), (0x2460, 0x24FF), (0x2500, 0x257F), (0x3000, 0x303F), (0x3040, 0x30FF),
    (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F),
    (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF), (0x10000, 0x1007F), (0x0300, 0x036F),
]


def rand_char(rng):
    lo, hi = rng.choice(BLOCKS)
    while True:
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF:
            continue
        return chr(c)


def gen_cases():
    rng = random.Random(20240601)
    cases = []
    cases += PROSE + CODE
    # numbers of many lengths, with and without surrounding text/space
    for n in range(1, 41):
        digits = "".join(str(rng.randint(0, 9)) for _ in range(n))
        cases.append(digits)
        cases.append(" " + digits)
        cases.append("x" + digits + "y")
        cases.append("a  " + digits + " b")
    for n in [0, 7, 42, 123, 1234, 65536, 1000000, 3141592653, 18446744073709551615]:
        cases.append(f"{n} items")
        cases.append(f"value={n}")
        cases.append(f"-{n}.{n % 97}")
    # contractions in various cases
    for c in ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'x", "'"]:
        cases.append(f"it{c} fine")
        cases.append(f"THEY{c}")
        cases.append(f" {c}")
        cases.append(f"{c}{c}")
    # whitespace runs
    for ws in [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t", "\u00a0", "\u3000", "\u2003", "\u200b"]:
        for k in (1, 2, 5):
            cases.append("a" + ws * k + "b")
            cases.append(ws * k + "word")
            cases.append("word" + ws * k)
            cases.append(ws * k)
    # punctuation runs
    puncts = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~…—–«»“”‘’¿¡·•"
    for _ in range(60):
        cases.append("".join(rng.choice(puncts) for _ in range(rng.randint(1, 12))) + rng.choice(["", " ", "a", "1", "\n"]))
    # word salads
    for _ in range(300):
        n = rng.randint(1, 25)
        parts = []
        for _ in range(n):
            w = rng.choice(WORDS)
            r = rng.random()
            if r < 0.1:
                w = w.upper()
            elif r < 0.2:
                w = w.capitalize()
            elif r < 0.25:
                w = str(rng.randint(0, 10 ** rng.randint(1, 8)))
            parts.append(w)
            parts.append(rng.choice(SEPS))
        cases.append("".join(parts))
    # random unicode across blocks
    for _ in range(300):
        n = rng.randint(1, 30)
        cases.append("".join(rand_char(rng) if rng.random() < 0.8 else rng.choice(SEPS) for _ in range(n)))
    # emoji combos
    emoji = ["😀", "👍", "👍🏻", "👍🏿", "👨‍💻", "👩‍🔬", "🏳️‍🌈", "🇺🇸", "🇬🇧", "🇨🇳", "❤️", "✨", "🔥", "🤖", "🧑‍🤝‍🧑", "👨‍👩‍👧"]
    for _ in range(60):
        cases.append("".join(rng.choice(emoji + [" ", "a", "!", "1"]) for _ in range(rng.randint(1, 8))))
    # mixed scripts
    for _ in range(80):
        cases.append(" ".join(rng.choice(PROSE) for _ in range(rng.randint(2, 4))))
    # long document
    cases.append("\n\n".join(PROSE + CODE))
    seen, out = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


SPECIAL_CASES = [
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text before<|endoftext|>text after",
    "<|im_start|><|im_end|><|im_start|>",
    "<repo_name>lockstep<file_sep>main.go<gh_stars>100",
    "not special: <|im_star|> <im_start> <|IM_START|>",
    "  <|im_start|>  spaced  <|im_end|>  ",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
]

CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "user", "content": "Hello!"}], False),
    ([{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the treasure?"}], True),
    ([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?\nExplain."}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
      {"role": "assistant", "content": "Blue."}], False),
    ([{"role": "user", "content": "Unicode: café 東京 😀 and\ttabs  and  spaces "}], True),
]


def write_pretok_cases(cases):
    """The pre-tokeniser splits by the standard regexes, run by tokenizers (Oniguruma)."""
    from tokenizers import Regex
    gpt2_re = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    llama3_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2_re = llama3_re.replace(r"\p{N}{1,3}", r"\p{N}")
    # DeepSeek-V3's tokenizer.json: three Splits in turn (llama.cpp's "deepseek-v3").
    deepseek3 = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                 "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                 "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
    splitters = {
        "gpt2": pre_tokenizers.Split(Regex(gpt2_re), behavior="isolated"),
        "llama-bpe": pre_tokenizers.Split(Regex(llama3_re), behavior="isolated"),
        "qwen2": pre_tokenizers.Split(Regex(qwen2_re), behavior="isolated"),
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           pre_tokenizers.Split(Regex(gpt2_re), behavior="isolated")]),
        "deepseek-v3": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in deepseek3]),
        # Mistral's Tekken (Mistral-Nemo's tokenizer.json).
        "tekken": pre_tokenizers.Split(Regex(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
    }
    n_pretok = 0
    with open(os.path.join(ROOT, "model", "testdata", "pretok_cases.jsonl"), "w", encoding="utf-8") as f:
        for i, text in enumerate(cases):
            if i % 2 and len(text) > 40:
                continue
            for name, sp in splitters.items():
                pieces = [p for p, _ in sp.pre_tokenize_str(text)]
                assert "".join(pieces) == text, (name, text)
                f.write(json.dumps({"pre": name, "text": text, "pieces": pieces}, ensure_ascii=False) + "\n")
                n_pretok += 1
    return n_pretok


def main():
    if sys.argv[1:] == ["--pretok-only"]:
        print(f"{write_pretok_cases(gen_cases())} pre-tokeniser cases", file=sys.stderr)
        return
    path = model_path()
    if not os.path.exists(path):
        sys.exit(f"{path} not found; run scripts/fetch-model.sh")
    meta = read_meta(path)
    ref = build_reference(meta)
    xcheck = build_transformers_gguf(meta)
    os.makedirs(OUT, exist_ok=True)

    cases = gen_cases()
    agree, disagree = 0, []
    with open(os.path.join(OUT, "tokenizer_cases.jsonl"), "w", encoding="utf-8") as f:
        for text in cases:
            ids = ref.encode(text, add_special_tokens=False).ids
            assert ref.decode(ids, skip_special_tokens=False) == text, repr(text)
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
            if xcheck.encode(text, add_special_tokens=False).ids == ids:
                agree += 1
            else:
                disagree.append(text)
        for text in SPECIAL_CASES:
            ids = ref.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids, "parse_special": True}, ensure_ascii=False) + "\n")

    template = meta["tokenizer.chat_template"]
    tokens = meta["tokenizer.ggml.tokens"]
    hf = PreTrainedTokenizerFast(
        tokenizer_object=ref,
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
        unk_token=tokens[meta["tokenizer.ggml.unknown_token_id"]],
    )
    hf.chat_template = template
    with open(os.path.join(OUT, "chat_cases.jsonl"), "w", encoding="utf-8") as f:
        for messages, agp in CONVERSATIONS:
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
            ids = ref.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"messages": messages, "add_generation_prompt": agp, "text": text, "ids": ids},
                               ensure_ascii=False) + "\n")

    n_pretok = write_pretok_cases(cases)

    versions = {
        "model": NAME,
        "reference": "tokenizers.Tokenizer: BPE(GGUF vocab, merges) + Sequence[Digits(individual_digits=True), "
                     "ByteLevel(add_prefix_space=False, use_regex=True)] + GGUF control tokens as special added tokens",
        "chat_reference": "transformers PreTrainedTokenizerFast.apply_chat_template(tokenize=False), GGUF chat template",
        "python": sys.version.split()[0],
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "cases": len(cases),
        "special_cases": len(SPECIAL_CASES),
        "chat_cases": len(CONVERSATIONS),
        "pretok_cases": n_pretok,
        "transformers_gguf_converter_agreement": f"{agree}/{len(cases)}",
        "transformers_gguf_converter_disagreement_examples": disagree[:10],
        "note": "transformers' GGUF converter has no entry for pre='smollm' and uses plain ByteLevel (no digit split); "
                "it differs from SmolLM2's tokenizer.json and llama.cpp where whitespace precedes digits.",
    }
    with open(os.path.join(OUT, "tokenizer_versions.json"), "w", encoding="utf-8") as f:
        json.dump(versions, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in versions.items() if "examples" not in k}, indent=1))


if __name__ == "__main__":
    main()
