"""The official openai client against `worker serve` (run by tests/serve_test.go).

usage: python openai_client_check.py BASE_URL API_KEY MODEL
Exits non-zero with a message on the first failed check; prints OK last.
"""
import json
import sys
import urllib.request

import openai
from openai import OpenAI

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


ids = [m.id for m in client.models.list().data]
check(model in ids, f"models.list has {model}: {ids}")

# Completions, not streaming and streaming: the same greedy text.
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(c.choices[0].text.startswith(" Paris."), f"completion text {c.choices[0].text!r}")
check(c.choices[0].finish_reason == "length", f"finish_reason {c.choices[0].finish_reason}")
check(c.usage.prompt_tokens == 5 and c.usage.completion_tokens == 8, f"usage {c.usage}")
parts, usage = [], None
for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True}):
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        parts.append(ch.text)
check("".join(parts) == c.choices[0].text, f"streamed {''.join(parts)!r} != {c.choices[0].text!r}")
check(usage is not None and usage.completion_tokens == 8, f"stream usage {usage}")

# Token-id prompts and stop strings.
c2 = client.completions.create(model=model, prompt=[504, 3575, 282, 4649, 314], max_tokens=8, temperature=0, stop=["."])
check(c2.choices[0].text == " Paris" and c2.choices[0].finish_reason == "stop", f"stop string: {c2.choices[0]}")

# Chat, not streaming and streaming.
msgs = [{"role": "user", "content": "What is 2+2?"}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=48, temperature=0)
answer = r.choices[0].message.content
check(r.choices[0].message.role == "assistant" and "4" in answer, f"chat answer {answer!r}")
check(r.choices[0].finish_reason == "stop", f"chat finish_reason {r.choices[0].finish_reason}")
text, role, finish = "", None, None
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=48, temperature=0, stream=True):
    for ch in chunk.choices:
        role = role or ch.delta.role
        text += ch.delta.content or ""
        finish = ch.finish_reason or finish
check(text == answer and role == "assistant" and finish == "stop", f"streamed chat {text!r} {role} {finish}")

# Sampling: a seed makes a sampled completion reproducible; another seed
# gives another text.
def sampled(seed):
    return client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.9,
                                     top_p=0.95, seed=seed).choices[0].text


a, b, c3 = sampled(7), sampled(7), sampled(8)
check(a == b, f"same seed, different texts: {a!r} {b!r}")
check(a != c3, f"seeds 7 and 8 gave the same text {a!r}")

# n > 1: n choices indexed 0..n-1; with a seed choice 0 is the n = 1
# answer, the others differ and the whole is reproducible; greedy choices
# are all the same; the usage counts the prompt once.
def sampled_n(seed):
    return client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.9,
                                     top_p=0.95, seed=seed, n=3)


n1, n2 = sampled_n(7), sampled_n(7)
check([ch.index for ch in n1.choices] == [0, 1, 2], f"n=3 indexes {[ch.index for ch in n1.choices]}")
texts = [ch.text for ch in n1.choices]
check(texts == [ch.text for ch in n2.choices], f"n=3 with a seed not reproducible: {texts}")
check(texts[0] == a, f"n=3 choice 0 {texts[0]!r} != the n=1 answer {a!r}")
check(len(set(texts)) > 1, f"n=3 sampled choices all alike: {texts}")
check(n1.usage.completion_tokens == 48 and n1.usage.prompt_tokens == n1.usage.total_tokens - 48, f"n=3 usage {n1.usage}")
g = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, n=2)
check([ch.text for ch in g.choices] == [c.choices[0].text] * 2, f"greedy n=2: {g.choices}")
check(g.usage.prompt_tokens == 5 and g.usage.completion_tokens == 16, f"greedy n=2 usage {g.usage}")

# Several prompts: choices prompt-major (index = prompt*n + j).
once = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
mp2 = client.completions.create(model=model, prompt=["The capital of France is", "Once upon a time"],
                                max_tokens=8, temperature=0, n=2)
check([ch.index for ch in mp2.choices] == [0, 1, 2, 3], f"several prompts: indexes {[ch.index for ch in mp2.choices]}")
check([ch.text for ch in mp2.choices] == [c.choices[0].text] * 2 + [once.choices[0].text] * 2, f"several prompts: {mp2.choices}")
check(mp2.usage.prompt_tokens == 5 + once.usage.prompt_tokens and mp2.usage.completion_tokens == 32,
      f"several prompts usage {mp2.usage}")
ids2 = client.completions.create(model=model, prompt=[[504, 3575, 282, 4649, 314], [504, 3575]], max_tokens=8, temperature=0)
check(ids2.choices[0].text == c.choices[0].text and len(ids2.choices) == 2, f"token-id prompts: {ids2.choices}")

# Streaming chat with n = 2: each index gets its role, its text and its finish.
by = {}
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=48, temperature=0, stream=True, n=2):
    for ch in chunk.choices:
        t, r0, f0 = by.get(ch.index, ("", None, None))
        by[ch.index] = (t + (ch.delta.content or ""), r0 or ch.delta.role, ch.finish_reason or f0)
check(by == {0: (answer, "assistant", "stop"), 1: (answer, "assistant", "stop")}, f"streamed chat n=2: {by}")

# vLLM's endpoints: /tokenize (the ids the completions endpoint queues),
# /detokenize, /version, with the API key.
def post_json(path, body, headers=None):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json",
                                          **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read()), r.headers


tk, _ = post_json("/tokenize", {"prompt": "The capital of France is"})
check(tk["count"] == 5 and tk["tokens"] == [504, 3575, 282, 4649, 314] and tk["max_model_len"] > 0, f"tokenize {tk}")
dt, _ = post_json("/detokenize", {"tokens": tk["tokens"]})
check(dt["prompt"] == "The capital of France is", f"detokenize {dt}")
banana, _ = post_json("/tokenize", {"prompt": " banana", "add_special_tokens": False})
check(banana["count"] >= 1, f"tokenize banana {banana}")

# X-Request-Id names the completion.
got, hdrs = post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, {"X-Request-Id": "abc-1"})
check(got["id"] == "cmpl-abc-1" and hdrs["X-Request-Id"] == "abc-1", f"X-Request-Id: {got['id']} {hdrs}")

# Penalties (OpenAI's and vLLM's): honoured, reproducible, and they change
# a greedy answer that repeats itself.
count = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
plain = client.completions.create(model=model, prompt=count, max_tokens=16, temperature=0).choices[0].text


def penalised():
    return client.completions.create(model=model, prompt=count, max_tokens=16, temperature=0, frequency_penalty=1.5,
                                     presence_penalty=1.0, extra_body={"repetition_penalty": 1.3}).choices[0].text


p1, p2 = penalised(), penalised()
check(p1 == p2, f"penalised greedy answers differ: {p1!r} {p2!r}")
check(p1 != plain, f"penalties changed nothing: {p1!r}")

# logit_bias: +100 on a token makes greedy decoding pick it.
lb = client.completions.create(model=model, prompt="The capital of France is", max_tokens=1, temperature=0,
                               logit_bias={str(banana["tokens"][0]): 100}, extra_body={"return_token_ids": True})
check(lb.choices[0].token_ids == [banana["tokens"][0]], f"logit_bias: {lb.choices[0]}")

# stop_token_ids: the answer ends at the token, without its text unless
# include_stop_str_in_output.
dot = post_json("/tokenize", {"prompt": ".", "add_special_tokens": False})[0]["tokens"][0]
st = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                               extra_body={"stop_token_ids": [dot]})
check(st.choices[0].text == " Paris" and st.choices[0].finish_reason == "stop", f"stop_token_ids: {st.choices[0]}")
st = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                               extra_body={"stop_token_ids": [dot], "include_stop_str_in_output": True})
check(st.choices[0].text == " Paris.", f"include_stop_str_in_output: {st.choices[0]}")

# echo: the prompt, then the completion.
ec = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, echo=True)
check(ec.choices[0].text == "The capital of France is" + c.choices[0].text, f"echo: {ec.choices[0].text!r}")

# min_p with a seed: reproducible.
mp = [client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=3,
                                extra_body={"min_p": 0.1}).choices[0].text for _ in range(2)]
check(mp[0] == mp[1], f"min_p with a seed: {mp}")

# logprobs (completions: an integer k; chat: logprobs + top_logprobs): the
# raw model distribution's, extra output that changes no token. Greedy: each
# token is the most probable one at its position, so its log-probability is
# the largest of its top list; streamed entries are the non-streamed ones.
lc = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=3)
ch0, lp = lc.choices[0], lc.choices[0].logprobs
check(ch0.text == c.choices[0].text, f"logprobs changed the text: {ch0.text!r}")
check(len(lp.tokens) == 8 and "".join(lp.tokens) == ch0.text, f"logprobs tokens {lp.tokens}")
check(all(v <= 0 for v in lp.token_logprobs), f"token_logprobs {lp.token_logprobs}")
check(all(3 <= len(top) <= 4 and max(top.values()) == v and top[t] == v
          for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)), f"top_logprobs {lp.top_logprobs}")
check(lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)], f"text_offset {lp.text_offset}")
streamed = []
for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                       logprobs=3, stream=True):
    for ch in chunk.choices:
        if ch.logprobs is not None:
            streamed += list(zip(ch.logprobs.tokens, ch.logprobs.token_logprobs, ch.logprobs.top_logprobs,
                                 ch.logprobs.text_offset))
check(streamed == list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)),
      f"streamed logprobs {streamed} != {lp}")
# In one batch with another choice (n = 2) and sampled: the same values
# (batch invariance; the sampled token's entry stands on its own when it is
# not among the top k).
g2 = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=3, n=2)
check(all(ch.logprobs.token_logprobs == lp.token_logprobs for ch in g2.choices), f"n=2 logprobs {g2.choices}")
s0 = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.5, seed=11, logprobs=0)
check(s0.choices[0].text == client.completions.create(model=model, prompt="Once upon a time", max_tokens=12,
                                                     temperature=1.5, seed=11).choices[0].text, "logprobs changed a sampled text")
check(all(list(top) == [t] for t, top in zip(s0.choices[0].logprobs.tokens, s0.choices[0].logprobs.top_logprobs)),
      f"logprobs=0 top maps {s0.choices[0].logprobs.top_logprobs}")
lr = client.chat.completions.create(model=model, messages=msgs, max_tokens=48, temperature=0, logprobs=True, top_logprobs=2)
content = lr.choices[0].logprobs.content
check(lr.choices[0].message.content == answer, f"chat logprobs changed the answer {lr.choices[0].message.content!r}")
check("".join(e.token for e in content).startswith(answer) and len(content) == lr.usage.completion_tokens,
      f"chat logprobs tokens {[e.token for e in content]}")
check(all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
          and e.top_logprobs[1].logprob <= e.logprob and bytes(e.bytes) == e.token.encode() for e in content),
      f"chat top_logprobs {content}")
sc = []
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=48, temperature=0, stream=True,
                                            logprobs=True, top_logprobs=2):
    for ch in chunk.choices:
        if ch.logprobs is not None:
            sc += ch.logprobs.content
check([(e.token, e.logprob) for e in sc] == [(e.token, e.logprob) for e in content], "streamed chat logprobs differ")

# Routing fields (docs/serving.md): OpenAI's prompt_cache_key as the client sends it, lockstep's
# and TensorRT-LLM's through extra_body; the answer is the same as without them (greedy).
plain = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0)
routed = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0,
                                   extra_body={"conversation_id": "c1", "attention_dp_rank": 1, "attention_dp_relax": False})
check(routed.choices[0].text == plain.choices[0].text, "a routed completion differs")
keyed = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, prompt_cache_key="agent-1")
check(keyed.choices[0].finish_reason in ("stop", "length"), "prompt_cache_key chat did not finish")

# Errors, in OpenAI's shape and with the right statuses.
def expect(exc, status, fn):
    try:
        fn()
    except exc as e:
        check(e.status_code == status, f"{exc.__name__}: status {e.status_code}, want {status}")
        return
    sys.exit(f"FAIL: no {exc.__name__}")


expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", max_tokens=0))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", n=2, best_of=3))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", logprobs=21))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", extra_body={"prompt_logprobs": 21}))
expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=model, messages=msgs, top_logprobs=2))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", temperature=3))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", extra_body={"no_such_field": 1}))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", extra_body={"guided_grammar": "root ::= x"}))
expect(openai.BadRequestError, 400, lambda: client.completions.create(model=model, prompt="x", extra_body={"attention_dp_rank": 2}))
expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=model, messages=msgs, prompt_cache_key="a",
                                                                            extra_body={"affinity_id": "b"}))
expect(openai.NotFoundError, 404, lambda: client.completions.create(model="no-such-model", prompt="x"))
expect(openai.APIStatusError, 413, lambda: client.completions.create(model=model, prompt="x", max_tokens=10_000_000))
bad = OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
expect(openai.AuthenticationError, 401, lambda: bad.completions.create(model=model, prompt="x"))
print("OK")
