"""The official openai client calling tools through `worker serve` (run by
tests/serve_test.go, TestOpenAIClientToolCalls).

The server runs SmolLM2-135M-Instruct with tests/testdata/hermes-tools.jinja,
--enable-auto-tool-choice --tool-call-parser hermes. Two earlier turns show
the model the call format; greedy, it then calls the tool for the third city.

usage: python openai_tools_check.py BASE_URL MODEL
Exits non-zero with a message on the first failed check; prints OK last.
"""
import json
import sys

import openai

from client_common import check, client_for

base, model = sys.argv[1], sys.argv[2]
client = client_for(base)


tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def shown(call_id, city):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


messages = [{"role": "user", "content": "Weather in Paris?"}, shown("call_1", "Paris"),
            {"role": "user", "content": "Weather in Berlin?"}, shown("call_2", "Berlin"),
            {"role": "user", "content": "Weather in Rome?"}]

# Whole: the call is the message's tool_calls.
r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=60, temperature=0)
ch = r.choices[0]
check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason!r}, message {ch.message}")
calls = ch.message.tool_calls
check(calls is not None and len(calls) == 1, f"tool_calls {calls}")
check(calls[0].type == "function" and calls[0].id.startswith("chatcmpl-tool-"), f"call {calls[0]}")
check(calls[0].function.name == "get_weather", f"function {calls[0].function}")
check(json.loads(calls[0].function.arguments) == {"city": "Rome"}, f"arguments {calls[0].function.arguments!r}")

# Streamed: the deltas, put together the way clients do, give the same call.
acc, finish, content = {}, None, ""
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=60,
                                            temperature=0, stream=True):
    for c in chunk.choices:
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            slot = acc.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
        finish = c.finish_reason or finish
check(finish == "tool_calls", f"streamed finish_reason {finish!r}")
check(list(acc) == [0], f"streamed calls {acc}")
check(acc[0]["name"] == "get_weather" and json.loads(acc[0]["arguments"]) == {"city": "Rome"}, f"streamed call {acc[0]}")
check(content == (ch.message.content or ""), f"streamed content {content!r} != {ch.message.content!r}")

# The call's result goes back as a tool message: an ordinary answer.
follow = messages + [shown(calls[0].id, "Rome"), {"role": "tool", "tool_call_id": calls[0].id, "content": "21 C, clear"}]
r2 = client.chat.completions.create(model=model, messages=follow, tools=tools, max_tokens=20, temperature=0)
check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"follow-up {r2.choices[0]}")

# tool_choice "none": no parsing, the text as written.
r3 = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="none", max_tokens=60,
                                    temperature=0)
check(r3.choices[0].message.tool_calls is None, f"tool_choice none gave calls {r3.choices[0].message}")
check("get_weather" in (r3.choices[0].message.content or ""), f"tool_choice none content {r3.choices[0].message.content!r}")

# A named function that is not among the tools is the client's error.
try:
    client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=8,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
    check(False, "a tool_choice naming an unknown function was accepted")
except openai.BadRequestError as e:
    check("get_time" in str(e) and "tool_choice" in str(e), f"tool_choice get_time: {e}")

print("OK")
