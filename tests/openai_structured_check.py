"""The official openai client asking `worker serve` for structured outputs
(run by tests/serve_test.go, TestOpenAIClientToolCalls, on the same server:
SmolLM2-135M-Instruct, two ranks, tests/testdata/hermes-tools.jinja).

A 135M model rarely writes valid JSON on its own; under a guide every
answer must parse and fit its schema, sampled or greedy, whole or streamed.

usage: python openai_structured_check.py BASE_URL MODEL
Exits non-zero with a message on the first failed check; prints OK last.
"""
import json
import re
import sys

import openai

from client_common import check, client_for

base, model = sys.argv[1], sys.argv[2]
client = client_for(base)


person = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0},
    "city": {"enum": ["Paris", "Rome", "Berlin"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}},
    "required": ["name", "age", "city"]}


def fits(obj):
    return (isinstance(obj, dict) and set(obj) <= {"name", "age", "city", "tags"}
            and isinstance(obj.get("name"), str) and len(obj["name"]) <= 20
            and isinstance(obj.get("age"), int) and obj["age"] >= 0
            and obj.get("city") in ("Paris", "Rome", "Berlin")
            and (("tags" not in obj) or (isinstance(obj["tags"], list) and len(obj["tags"]) <= 3)))


ask = [{"role": "user", "content": "Describe a person who lives in Rome as JSON."}]
fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}

# response_format json_schema: greedy and sampled answers parse and fit.
for temp, seed in ((0, None), (1.0, 1), (1.0, 2), (1.3, 3)):
    r = client.chat.completions.create(model=model, messages=ask, response_format=fmt, max_tokens=120,
                                       temperature=temp, seed=seed)
    ch = r.choices[0]
    check(ch.finish_reason == "stop", f"json_schema T={temp}: finish_reason {ch.finish_reason!r} ({ch.message.content!r})")
    try:
        obj = json.loads(ch.message.content)
    except ValueError as e:
        sys.exit(f"FAIL: json_schema T={temp}: {ch.message.content!r} is not JSON: {e}")
    check(fits(obj), f"json_schema T={temp}: {obj} does not fit the schema")

# Streamed: the pieces put together are the whole answer's text.
whole = client.chat.completions.create(model=model, messages=ask, response_format=fmt, max_tokens=120, temperature=0)
text = ""
for chunk in client.chat.completions.create(model=model, messages=ask, response_format=fmt, max_tokens=120,
                                            temperature=0, stream=True):
    for c in chunk.choices:
        text += c.delta.content or ""
check(text == whole.choices[0].message.content, f"streamed {text!r}, whole {whole.choices[0].message.content!r}")

# json_object: any JSON object (greedy: sampled, this small model may
# write a key for ever, and the answer ends at max_tokens).
r = client.chat.completions.create(model=model, messages=ask, response_format={"type": "json_object"},
                                   max_tokens=150, temperature=0)
c = r.choices[0].message.content
try:
    check(isinstance(json.loads(c), dict), f"json_object: {c!r} is not an object")
except ValueError as e:
    sys.exit(f"FAIL: json_object: {c!r} is not JSON: {e}")

# vLLM's guided_choice and guided_regex (extra_body), on completions too.
r = client.chat.completions.create(model=model, max_tokens=10, temperature=0,
                                   messages=[{"role": "user", "content": "Is the sky blue?"}],
                                   extra_body={"guided_choice": ["yes", "no"]})
check(r.choices[0].message.content in ("yes", "no"), f"guided_choice: {r.choices[0].message.content!r}")
r = client.completions.create(model=model, prompt="The year the Berlin wall fell:", max_tokens=10, temperature=0,
                              extra_body={"guided_regex": "[12][0-9]{3}"})
check(re.fullmatch("[12][0-9]{3}", r.choices[0].text) is not None, f"guided_regex: {r.choices[0].text!r}")
check(r.choices[0].finish_reason == "stop", f"guided_regex: finish_reason {r.choices[0].finish_reason!r}")

# allowed_token_ids: every token of the answer is one of them.
import urllib.request
def token_ids(text):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"prompt": text, "add_special_tokens": False}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["tokens"]
allowed = sorted(set(token_ids(" yes no maybe")))
r = client.completions.create(model=model, prompt="Is the sky blue? Answer:", max_tokens=6, temperature=1.0, seed=9,
                              logprobs=0, extra_body={"allowed_token_ids": allowed, "return_token_ids": True})
got = r.choices[0].model_extra.get("token_ids") or []
check(len(got) == 6 and set(got) <= set(allowed), f"allowed_token_ids {allowed}: token_ids {got}")

# bad_words: greedy, the model names Paris; with the word banned it
# cannot, at the start of the answer or after a space.
ask_capital = dict(model=model, prompt="Q: What is the capital of France?\nA: The capital of France is", max_tokens=12,
                   temperature=0)
plain = client.completions.create(**ask_capital).choices[0].text
check("Paris" in plain, f"without bad_words the answer is {plain!r}")
banned = client.completions.create(**ask_capital, extra_body={"bad_words": ["Paris"]}).choices[0].text
check("Paris" not in banned, f"bad_words [Paris]: {banned!r}")

# Forced tool calls: a named function, and "required".
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}]
weather = [{"role": "user", "content": "What is the weather like in Rome?"}]
for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
    r = client.chat.completions.create(model=model, messages=weather, tools=tools, tool_choice=choice,
                                       max_tokens=60, temperature=0)
    calls = r.choices[0].message.tool_calls
    check(calls is not None and len(calls) >= 1, f"tool_choice {choice}: tool_calls {calls} ({r.choices[0].message})")
    check(calls[0].function.name == "get_weather", f"tool_choice {choice}: {calls[0]}")
    args = json.loads(calls[0].function.arguments)
    check(isinstance(args.get("city"), str), f"tool_choice {choice}: arguments {args}")

# A schema the server cannot honour is the client's error, naming the field.
try:
    client.chat.completions.create(model=model, messages=ask, max_tokens=5,
                                   response_format={"type": "json_schema", "json_schema": {
                                       "name": "x", "schema": {"not": {"type": "string"}}}})
    sys.exit("FAIL: an unsupported schema was accepted")
except openai.BadRequestError as e:
    check("not" in str(e) and "response_format" in str(e), f"unsupported schema: {e}")

print("OK")
