// Package jinja renders the Jinja templates that model checkpoints carry
// as their chat template, the way Hugging Face transformers'
// apply_chat_template does (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, the loop controls, raise_exception and
// strftime_now), and within limits: a template comes with the checkpoint,
// and a checkpoint is untrusted input. A template that recurses without
// end, loops a billion times, builds a ten-gigabyte string or is itself ten
// megabytes long fails with an error naming the limit; it never exhausts
// the stack, the memory or the time of the process that renders it.
//
// Limits (Limits; DefaultLimits):
//   - the template's size, checked by Compile;
//   - the nesting of macro calls and of the parsed template (each is a
//     recursion of the renderer or parser);
//   - steps: every statement executed, expression evaluated and loop
//     iteration run costs one, and operations on big values cost more;
//   - bytes: the output, and every string or list a render builds;
//   - time: a wall-clock deadline per render.
//
// The language is the part of Jinja that chat templates use: text,
// {{ }}, {% %} and {# #} with whitespace control (-, +); if/elif/else,
// for (with unpacking, an if filter, else, loop.*, break and continue),
// set (names, namespace attributes, blocks), macro, and HF's generation
// block; literals, lists, tuples, dicts, attribute and item access,
// slices, calls, filters, tests, the arithmetic, comparison, membership,
// logical, concatenation and conditional operators; the Python string,
// list and dict methods templates call; and the common filters and
// tests. Values follow Python: they print as Python's str() does, compare
// and combine by its rules, and an undefined value prints as "" but
// cannot be combined. Lists and dicts are immutable, as in the sandbox.
// Anything else is refused when compiled, with its line.
package jinja
