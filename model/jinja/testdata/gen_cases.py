"""Regenerates cases.jsonl: each template rendered by jinja2 the way Hugging
Face transformers' apply_chat_template does (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception).
The Go renderer must give the same output, or fail where jinja2 fails.

    python3 gen_cases.py > cases.jsonl    (jinja2 3.1)
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

MSGS = [
    {"content": "You are terse.", "role": "system"},
    {"content": "  Hi there \n", "role": "user"},
    {"content": "Hello! <think>hmm</think>ok", "role": "assistant"},
    {"content": "Say \"bye\" & 'go'\u00e9", "role": "user"},
]
DATA = {"messages": MSGS, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
        "tools": [{"function": {"description": "Adds", "name": "add", "parameters": {"a": 1, "b": [1.5, None, True]}}, "type": "function"}]}

CASES = [
    # whitespace control
    "a\n  {% if true %}\nx\n  {% endif %}\nb {# c #}\n  {#- d #}  e",
    "{% for m in messages -%}\n  [{{ m.role }}]\n{%- endfor %}|",
    "  {%+ if true %}x{% endif %}\n{% if true +%}\ny{% endif %}",
    "{{- '  a  ' -}}  \n  {{ 'b' }}\n{% raw %}{{ x }}{% endraw %}\n",
    "{% for i in range(3) %}\n    {{ i }}\n{% endfor %}\n",
    # literals and printing
    "{{ [1,'a',none,true,1.5,{'k':2}] }}|{{ 1e20 }}|{{ 10/4 }}|{{ -7//2 }}|{{ -7%3 }}|{{ 2**10 }}|{{ (1,2) }}|{{ (1,) }}|{{ 0.1 + 0.2 }}|{{ 1e-5 }}|{{ 123456789.0 }}",
    "{{ 'it''s' }}{{ \"a\\tb\\n\" }}{{ 'x' ~ 1 ~ none ~ true }}{{ 3 * 'ab' }}{{ [0] * 3 }}",
    "{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'abcdef'[1:4] }}{{ 'abcdef'[::-1] }}{{ 'abcdef'[::2] }}{{ [1,2,3][-2:] }}{{ 'abc'[5] }}|{{ [1][3] }}",
    "{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'b' in 'abc' }}{{ 2 not in [1] }}{{ 'k' in {'k': 1} }}",
    "{{ not true or false and true }}{{ 0 or '' or 'x' }}{{ 1 and 0 }}{{ 'y' if 1 > 2 else 'n' }}{{ 'a' if false }}|",
    "{{ '%s-%d' % ('a', 3) }}{{ '%s' % 'x' }}",
    "{{ messages[0]['role'] }}{{ messages[0].content }}{{ messages | length }}{{ messages[9] is defined }}{{ nope is undefined }}",
    # loops
    "{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b') }};{% endfor %}",
    "{% for a, b in [[1,2],[3,4]] %}{{ a }}{{ b }}{% endfor %}{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }}{% endfor %}{% for k in {'z': 1, 'y': 2} %}{{ k }}{% endfor %}",
    "{% for x in range(10) if x is odd %}{{ x }}{% else %}none{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}|{{ x }}",
    "{% set x = 5 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{% endfor %}|{{ x }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}",
    "{% for x in range(1, 10, 3) %}{{ x }}{% endfor %}{% for x in range(5, 0, -2) %}{{ x }}{% endfor %}",
    # set, macros
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}in{{ a }}block{% endset %}[{{ c }}]",
    "{% macro f(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ f(1) }}{{ f(1, b=3) }}{{ f(b=4, a=0) }}{{ f() }}",
    "{% macro row(m) %}<{{ m.role }}>{% endmacro %}{% for m in messages %}{{ row(m) }}{% endfor %}",
    "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(5) }}",
    # filters
    "{{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'ab' | upper }}{{ 'AB' | lower }}{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}",
    "{{ [3,1,2] | sort }}{{ [3,1,2] | sort(reverse=true) }}{{ [1,2] | reverse | list }}{{ [1,1,2] | unique | list }}{{ [1,2,3] | sum }}{{ [3,1] | min }}{{ [3,1] | max }}{{ [1,2] | first }}{{ [1,2] | last }}",
    "{{ ['a','b'] | join(', ') }}{{ messages | map(attribute='role') | join('|') }}{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}",
    "{{ x | default('d') }}{{ '' | default('e', true) }}{{ none | default('f') }}{{ 3.7 | int }}{{ '42' | int }}{{ 'z' | int }}{{ 2 | float }}{{ -3 | abs }}{{ 2.5 | round }}{{ 3.14159 | round(2) }}",
    "{{ tools | tojson }}|{{ tools[0].function | tojson(indent=2) }}|{{ {'b': 1, 'a': [] , 'c': {}} | tojson(sort_keys=true) }}|{{ 'é\"\\n' | tojson }}|{{ [1.0, 2.50, -0.0] | tojson }}",
    "{{ {'b': 1, 'a': 2} | dictsort }}{% for k, v in {'b': 1, 'a': 2} | items %}{{ k }}{{ v }}{% endfor %}{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a b  c' | wordcount }}|{{ 'aXbX' | replace('X', '-') }}{{ 'aaa' | replace('a', 'b', 2) }}",
    "{{ [1,2,3,4] | select('odd') | list }}{{ [1,2,3,4] | reject('even') | list }}{{ ['a','b'] | map('upper') | list }}{{ 'abc' | list }}{{ 'x' | string }}{{ 5 | string }}{{ [] | length }}{{ 'héllo' | length }}",
    # tests
    "{{ 3 is divisibleby 3 }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ none is none }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}{{ 2 is even }}{{ true is boolean }}{{ 1 is not string }}{{ 'ab' is lower }}{{ 3 is gt 2 }}{{ 1 is in [1] }}",
    # methods
    "{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}{{ 'a b  c'.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'abc'.upper() }}{{ 'ABC'.lower() }}{{ 'a-b'.replace('-', '+') }}{{ 'banana'.find('an') }}{{ 'banana'.rfind('an') }}{{ 'banana'.count('a') }}{{ ', '.join(['x', 'y']) }}{{ '12'.isdigit() }}{{ 'a\\nb'.splitlines() }}",
    "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 9) }}{{ {'a': 1}.get('b') }}{{ {'a': 1, 'b': 2}.keys() | list }}{{ {'a': 1}.values() | list }}{{ [1,2,1].count(1) }}{{ [5,6].index(6) }}",
    "{{ messages[2].content.split('</think>')[-1] }}|{{ (messages[2].content.split('<think>')[0]).strip() }}|{{ messages[1].content | trim }}",
    # chat-template shapes
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] | trim + ' [/INST]' }}{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim + eos_token }}{% else %}{{ '<<SYS>>' + m['content'] + '<</SYS>>' }}{% endif %}{% endfor %}",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools><|im_end|>\\n\" }}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == 'assistant' %}\n        {%- set content = message.content %}\n        {%- if '</think>' in content %}\n            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n        {%- endif %}\n        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n",
    "{% set ns = namespace(system='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% endif %}{% endfor %}{{ bos_token }}{{ ns.system }}{% for m in messages | rejectattr('role', 'equalto', 'system') %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}",
    "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}{{ messages[0].role }}",
    "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
    # errors jinja2 also raises
    "{{ x.y }}",
    "{{ x + 'a' }}",
    "{{ 5 // 0 }}",
    "{{ 'a' < 1 }}",
    "{% if %}",
    "{% for x in %}{% endfor %}",
    "{{ nofunc(1) }}",
    "{{ 1 | nofilter }}",
    "{{ raise_exception('boom') }}",
    "{% if true %}unclosed",
    "{{ messages[0] | tojson }}{{ x | tojson }}",
]


def main():
    for i, src in enumerate(CASES):
        case = {"name": "case%02d" % i, "template": src, "data": DATA}
        # HF's AssistantTracker renders {% generation %} blocks as their body.
        plain = src.replace("{% generation %}", "").replace("{% endgeneration %}", "")
        try:
            case["want"] = env.from_string(plain).render(**DATA)
        except Exception as e:  # noqa: BLE001 - any failure is "must fail"
            case["error"] = type(e).__name__ + ": " + str(e)
        sys.stdout.write(json.dumps(case, ensure_ascii=False) + "\n")


main()
