"""The official openai client on `worker serve`'s Responses API
(POST /v1/responses; run by tests/serve_test.go, TestOpenAIClientToolCalls,
on its server: SmolLM2-135M-Instruct, two ranks, hermes-tools.jinja).

usage: python openai_responses_check.py BASE_URL MODEL
Exits non-zero with a message on the first failed check; prints OK last.
"""
import json
import sys

import openai

from client_common import check, client_for

base, model = sys.argv[1], sys.argv[2]
client = client_for(base)


# Whole: output_text, usage, and the same text as chat gives the same turn.
r = client.responses.create(model=model, input="Tell me a story.", instructions="You are a storyteller.",
                            max_output_tokens=24, temperature=0)
check(r.object == "response" and r.id.startswith("resp_"), f"response {r.id} {r.object}")
check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", f"status {r.status} {r.incomplete_details}")
check(r.usage.output_tokens == 24 and r.usage.input_tokens > 0, f"usage {r.usage}")
chat = client.chat.completions.create(model=model, max_tokens=24, temperature=0, messages=[
    {"role": "system", "content": "You are a storyteller."}, {"role": "user", "content": "Tell me a story."}])
check(r.output_text == chat.choices[0].message.content, f"responses {r.output_text!r}, chat {chat.choices[0].message.content!r}")

# Streamed: the deltas make the final response's text.
text, final, types = "", None, []
for ev in client.responses.create(model=model, input="Tell me a story.", instructions="You are a storyteller.",
                                  max_output_tokens=24, temperature=0, stream=True):
    types.append(ev.type)
    if ev.type == "response.output_text.delta":
        text += ev.delta
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check(types[:2] == ["response.created", "response.in_progress"], f"events {types[:4]}")
check(final is not None and final.output_text == text == r.output_text, f"streamed {text!r}, final {final}")

# text.format json_schema: valid JSON of the schema.
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
r = client.responses.create(model=model, input="Describe a person in Rome as JSON.", max_output_tokens=80, temperature=0,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
obj = json.loads(r.output_text)
check(isinstance(obj.get("name"), str) and isinstance(obj.get("age"), int), f"json_schema: {r.output_text!r}")

# Function tools: a forced call, then its output sent back as input items.
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}]
r = client.responses.create(model=model, input="What is the weather in Rome?", tools=tools, tool_choice="required",
                            parallel_tool_calls=False, max_output_tokens=40, temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), f"output {r.output}")
r2 = client.responses.create(model=model, tools=tools, tool_choice="none", max_output_tokens=20, temperature=0, input=[
    {"role": "user", "content": "What is the weather in Rome?"},
    {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C, sunny"}])
check(r2.output[0].type == "message" and r2.output_text != "", f"after the call: {r2.output}")
evs = list(client.responses.create(model=model, input="What is the weather in Rome?", tools=tools, max_output_tokens=40,
                                   tool_choice={"type": "function", "name": "get_weather"}, temperature=0, stream=True))
item = evs[-1].response.output[0]
check(item.type == "function_call" and item.name == "get_weather", f"streamed named call: {item}")

# The output text's log-probabilities (include, top_logprobs): one entry per
# token, the texts joined are the answer (then the stop token's, as chat's
# entries have it), greedy tokens the top ones.
r = client.responses.create(model=model, input="What is 2+2?", max_output_tokens=8, temperature=0,
                            include=["message.output_text.logprobs"], top_logprobs=2)
part = r.output[0].content[0]
check(len(part.logprobs) > 0 and "".join(e.token for e in part.logprobs).startswith(part.text),
      f"logprobs {[e.token for e in part.logprobs]} against {part.text!r}")
check(all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in part.logprobs), "top logprobs")

# What lockstep cannot do is the client's error.
try:
    client.responses.create(model=model, input="x", previous_response_id="resp_1")
    sys.exit("FAIL: previous_response_id was accepted")
except openai.BadRequestError as e:
    check("previous_response_id" in str(e), f"previous_response_id: {e}")

print("OK")
