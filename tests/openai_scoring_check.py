"""The official openai client scoring prompts on `worker serve` (run by
tests/serve_test.go, TestOpenAIClientToolCalls, on the same server:
SmolLM2-135M-Instruct, two ranks): echo with logprobs, as
lm-evaluation-harness's loglikelihood requests send it, and vLLM's
prompt_logprobs on both endpoints, whole and streamed.

usage: python openai_scoring_check.py BASE_URL MODEL
Exits non-zero with a message on the first failed check; prints OK last.
"""
import json
import sys
import urllib.request

from client_common import check, client_for

base, model = sys.argv[1], sys.argv[2]
client = client_for(base)


def tokenize(text):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"model": model, "prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


# A greedy continuation with its log-probabilities, then the prompt and the
# continuation sent back as one prompt (token ids) with echo: the echoed
# entries of the continuation are its generation's, exactly (the engine's
# rows do not depend on the batch or on how the prompt was chunked).
ctx = tokenize("The capital of France is")
gen = client.completions.create(model=model, prompt=ctx, max_tokens=6, temperature=0, logprobs=3,
                                extra_body={"return_token_ids": True})
out = gen.choices[0].model_extra["token_ids"]
check(len(out) == 6, f"greedy continuation: {len(out)} tokens")
echo = client.completions.create(model=model, prompt=ctx + out, max_tokens=1, temperature=0, logprobs=3, echo=True)
lp = echo.choices[0].logprobs
n = len(ctx) + len(out)
check(len(lp.tokens) == n + 1, f"echo: {len(lp.tokens)} entries for {n} prompt tokens and 1 generated")
check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "echo: the first prompt token's entries are null")
check(lp.token_logprobs[len(ctx):n] == gen.choices[0].logprobs.token_logprobs,
      f"echo: the continuation's log-probabilities {lp.token_logprobs[len(ctx):n]} differ from its generation's "
      f"{gen.choices[0].logprobs.token_logprobs}")
check(lp.top_logprobs[len(ctx):n] == gen.choices[0].logprobs.top_logprobs, "echo: the continuation's top tokens differ")
check(echo.choices[0].text.startswith("The capital of France is"), f"echo text {echo.choices[0].text!r}")


# lm-evaluation-harness's loglikelihood: the continuation's log-probability
# and whether it is the greedy one, from echo with logprobs 1 and
# max_tokens 1 (its request), the entries after the context.
def loglikelihood(context, continuation):
    c, whole = tokenize(context), tokenize(context + continuation)
    check(whole[:len(c)] == c, f"{context!r} + {continuation!r}: the context's tokens change")
    r = client.completions.create(model=model, prompt=whole, max_tokens=1, temperature=0, logprobs=1, echo=True)
    lps = r.choices[0].logprobs
    span = slice(len(c), len(whole))
    greedy = all(max(top, key=top.get) == tok for tok, top in zip(lps.tokens[span], lps.top_logprobs[span]))
    return sum(lps.token_logprobs[span]), greedy


paris, paris_greedy = loglikelihood("The capital of France is", " Paris")
london, _ = loglikelihood("The capital of France is", " London")
check(paris > london, f"loglikelihood: Paris {paris:.3f} not above London {london:.3f}")
check(paris_greedy, "loglikelihood: ' Paris' is the greedy continuation")

# vLLM's prompt_logprobs: null, then per prompt token its own entry (rank
# and text) and the k most probable; the greedy continuation ranks 1.
r = client.completions.create(model=model, prompt=ctx + out, max_tokens=1, temperature=0,
                              extra_body={"prompt_logprobs": 2})
pl = r.choices[0].model_extra["prompt_logprobs"]
check(len(pl) == n and pl[0] is None, f"prompt_logprobs: {len(pl)} entries for {n} prompt tokens")
for i in range(1, n):
    entry = pl[i]
    tok = str((ctx + out)[i])
    check(tok in entry and 2 <= len(entry) <= 3, f"prompt_logprobs[{i}]: {entry} lacks the prompt token {tok}")
    check({e["rank"] for e in entry.values()} >= {1, 2}, f"prompt_logprobs[{i}]: ranks {entry}")
    if i >= len(ctx):
        check(entry[tok]["rank"] == 1, f"prompt_logprobs[{i}]: the greedy token's rank {entry[tok]['rank']}")
        check(entry[tok]["logprob"] == lp.token_logprobs[i], f"prompt_logprobs[{i}]: {entry[tok]} vs echo's {lp.token_logprobs[i]}")

# Streamed: the first chunk carries them, once.
seen = []
for chunk in client.completions.create(model=model, prompt=ctx + out, max_tokens=3, temperature=0, stream=True,
                                       extra_body={"prompt_logprobs": 2}):
    for c in chunk.choices:
        if (c.model_extra or {}).get("prompt_logprobs") is not None:
            seen.append(c.model_extra["prompt_logprobs"])
check(seen == [pl], f"streamed prompt_logprobs: {len(seen)} chunks carried them (or they differ)")

# Chat: at the top level, over the rendered conversation.
ask = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=ask, max_tokens=4, temperature=0,
                                   extra_body={"prompt_logprobs": 0})
pl = r.model_extra["prompt_logprobs"]
check(pl[0] is None and len(pl) == r.usage.prompt_tokens, f"chat prompt_logprobs: {len(pl)} for {r.usage.prompt_tokens} tokens")
check(all(len(e) == 1 and list(e.values())[0]["logprob"] <= 0 for e in pl[1:]), "chat prompt_logprobs: one entry each")

print("OK")
