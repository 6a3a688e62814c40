// bench.mjs: llama.cpp's CPU speed on a GGUF through node-llama-cpp's
// prebuilt build (no compiler needed), for scripts/bench-vs-llamacpp.sh.
//
//   node bench.mjs MODEL THREADS
//
// Prints one JSON line: prefill tokens/s of one 512-token prompt, decode
// tokens/s of one sequence over 128 tokens, and the decode tokens/s of 8
// sequences decoding 128 tokens together after their prompts (the shapes of
// lockstep's BenchmarkSmolLM2). Greedy; prompts are fixed pseudo-random ids.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, threadsArg] = process.argv.slice(2);
const threads = Number(threadsArg);
if (!modelPath || !(threads >= 1)) {
  console.error("usage: node bench.mjs MODEL THREADS");
  process.exit(2);
}
const PROMPT = 512, DECODE = 128, BATCH = 8;

function promptIds(seed, n, vocab) {
  const ids = [];
  let x = BigInt(seed) * 0x9E3779B97F4A7C15n + 1n;
  const mask = (1n << 64n) - 1n;
  for (let i = 0; i < n; i++) {
    x ^= (x << 13n) & mask; x ^= x >> 7n; x ^= (x << 17n) & mask;
    ids.push(Number(x % BigInt(vocab - 100)) + 100);  // clear of the special tokens
  }
  return ids;
}

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = model.tokens.vocabularySize ?? 49152;

// One sequence: the time to its first token is the prompt's prefill.
async function single() {
  const ctx = await model.createContext({contextSize: 1024, threads, batchSize: 512, sequences: 1});
  const seq = ctx.getSequence();
  const it = seq.evaluate(promptIds(1, PROMPT, vocab), {temperature: 0});
  const t0 = performance.now();
  await it.next();
  const t1 = performance.now();
  for (let n = 1; n < DECODE; n++) await it.next();
  const t2 = performance.now();
  await ctx.dispose();
  return {prefill: PROMPT / ((t1 - t0) / 1000), decode: (DECODE - 1) / ((t2 - t1) / 1000)};
}

// BATCH sequences decoding together (llama.cpp batches their steps).
async function batched() {
  const ctx = await model.createContext({contextSize: BATCH * 1024, threads, batchSize: 512 * BATCH, sequences: BATCH});
  const its = [];
  for (let i = 0; i < BATCH; i++) its.push(ctx.getSequence().evaluate(promptIds(10 + i, PROMPT, vocab), {temperature: 0}));
  await Promise.all(its.map((it) => it.next()));
  const t0 = performance.now();
  for (let n = 1; n < DECODE; n++) await Promise.all(its.map((it) => it.next()));
  const t1 = performance.now();
  await ctx.dispose();
  return BATCH * (DECODE - 1) / ((t1 - t0) / 1000);
}

await single();  // warm-up: the first evaluation allocates llama.cpp's buffers
const s = await single();
const b = await batched();
console.log(JSON.stringify({engine: "llama.cpp", threads, prefill_tok_s: s.prefill, decode_tok_s: s.decode,
  batch8_decode_tok_s: b}));
await model.dispose();
process.exit(0);
