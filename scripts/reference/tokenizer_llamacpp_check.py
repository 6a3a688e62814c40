#!/usr/bin/env python3
"""tokenizer_llamacpp_check.py: optional second reference for the tokenizer fixture.

Tokenizes every case of model/testdata/smollm2/tokenizer_cases.jsonl (and the
chat cases) with llama.cpp through llama-cpp-python (vocab only, no weights),
compares with the fixture ids, and writes
model/testdata/smollm2/llamacpp_check.json (versions, agreement, the first
disagreements). The fixture itself comes from tokenizer_reference.py; this
only cross-checks it.

Usage: python3 scripts/reference/tokenizer_llamacpp_check.py [model.gguf]
Needs: pip install llama-cpp-python
"""
import json
import os
import sys

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "model", "testdata", "smollm2")
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.environ.get("LOCKSTEP_MODEL_CACHE", os.path.expanduser("~/.cache/lockstep/models")), NAME)
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    cases = [json.loads(l) for l in open(os.path.join(DATA, "tokenizer_cases.jsonl"), encoding="utf-8")]
    cases += [dict(c, parse_special=True) for c in
              (json.loads(l) for l in open(os.path.join(DATA, "chat_cases.jsonl"), encoding="utf-8"))]
    agree, diffs = 0, []
    for c in cases:
        got = llm.tokenize(c["text"].encode("utf-8"), add_bos=False, special=bool(c.get("parse_special")))
        if got == c["ids"]:
            agree += 1
        else:
            diffs.append({"text": c["text"], "llama_cpp": got, "fixture": c["ids"]})
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "cases": len(cases),
        "agree": agree,
        "disagreements": diffs[:20],
    }
    with open(os.path.join(DATA, "llamacpp_check.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}): {agree}/{len(cases)} cases agree")


if __name__ == "__main__":
    main()
