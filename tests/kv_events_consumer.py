"""A KV event consumer written against vLLM's own definitions (run by tests/kvevents_test.go).

usage: python kv_events_consumer.py BASE_URL PUB_PORT REPLAY_PORT RANKS TOPIC OUT_JSON

It subscribes to every rank's PUB socket (port + rank) with pyzmq, decodes every batch with
msgspec into vLLM's structs, drives a conversation trace through BASE_URL, drops rank 1's
subscriber halfway and reconnects it, fills every gap through the rank's ROUTER replay socket
(port + rank), checks that the replayed batches equal the live ones byte for byte, and writes
the stored and removed blocks of each rank, in order, to OUT_JSON. Then it does what a KV-aware
router does: rebuilds each rank's blocks from the events and checks that prompts pinned to a rank
report the cached tokens the events predict (the server runs with
--enable-prompt-tokens-details). Prints OK last.
"""
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import zmq

base, pub_port, replay_port, ranks, topic, out_path = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                       int(sys.argv[4]), sys.argv[5], sys.argv[6])


# --- vllm/distributed/kv_events.py (v0.11 layout, with lora_name) ------------------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
# ------------------------------------------------------------------------------------------------


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
ctx = zmq.Context()
live = [dict() for _ in range(ranks)]  # rank -> seq -> payload


def subscribe(r):
    s = ctx.socket(zmq.SUB)
    s.connect(f"tcp://127.0.0.1:{pub_port + r}")
    s.setsockopt_string(zmq.SUBSCRIBE, topic)
    return s


subs = [subscribe(r) for r in range(ranks)]


def drain(timeout_ms=50):
    poller = zmq.Poller()
    for s in subs:
        if s is not None:
            poller.register(s, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(timeout_ms))
        if not ready:
            return
        for r, s in enumerate(subs):
            if s is not None and s in ready:
                t, seq, payload = s.recv_multipart()
                check(t == topic.encode(), f"topic {t!r}")
                live[r][int.from_bytes(seq, "big")] = payload


def complete(prompt):
    req = urllib.request.Request(base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": prompt, "max_tokens": 6, "temperature": 0}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


# A conversation trace: each turn extends the previous prompt and answer (prefix reuse); the
# conversations of a wave run at once (so that both ranks serve some), and there are enough of
# them to make the small pools evict (removals). Rank 1's subscriber drops out after the first
# wave and comes back after the second.
def conversation(subject):
    prompt = f"Tell me a story about {subject}. " * 5
    for _ in range(2):
        prompt += complete(prompt) + " Go on, and say more about it. "


waves = [["the sea", "a mountain", "the city at night", "an old library"],
         ["a long train journey", "a garden in spring", "the desert", "a winter village"],
         ["a river", "the moon", "a busy market", "a quiet forest"]]
time.sleep(0.5)  # the subscriptions reach the publishers
with ThreadPoolExecutor(max_workers=4) as pool:
    for i, wave in enumerate(waves):
        for f in [pool.submit(conversation, s) for s in wave]:
            while not f.done():
                drain(20)
            f.result()
        drain(100)
        if i == 0:
            subs[1].close(linger=0)  # rank 1's subscriber drops out
            subs[1] = None
        elif i == 1:
            subs[1] = subscribe(1)  # and comes back
            time.sleep(0.3)
time.sleep(1.0)
drain(200)


def replay(r, start):
    d = ctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{replay_port + r}")
    d.send_multipart([b"", start.to_bytes(8, "big")])
    got = {}
    while True:
        check(d.poll(10000), f"rank {r}: no replay answer")
        empty, seq, payload = d.recv_multipart()
        check(empty == b"", "replay frames start with the empty delimiter")
        n = int.from_bytes(seq, "big", signed=True)
        if n == -1:
            check(payload == b"", "the end marker has an empty payload")
            break
        got[n] = payload
    d.close(linger=0)
    return got


# --- What a KV-aware router does with the stream: it rebuilds each rank's blocks from the events
# and predicts how much of a prompt a rank has cached. Prompts pinned to a rank (strict
# attention_dp_rank) must then report (usage.prompt_tokens_details.cached_tokens) at least the
# full blocks the events predict, and less than one block more (lockstep also reuses a partial
# last block, which the events leave out); never the whole prompt (its last token is computed).
state = [{"next": 0, "blocks": {}, "child": {}} for _ in range(ranks)]


def apply(r, payload):
    st = state[r]
    for ev in decoder.decode(payload).events:
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            check(parent is None or parent in st["blocks"], f"rank {r}: a block stored under unknown parent {parent}")
            for i, h in enumerate(ev.block_hashes):
                toks = tuple(ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size])
                check(h not in st["blocks"], f"rank {r}: block {h} stored twice")
                st["blocks"][h] = (parent, toks)
                st["child"][(parent, toks)] = h
                parent = h
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                check(h in st["blocks"], f"rank {r}: unknown block {h} removed")
                parent, toks = st["blocks"].pop(h)
                st["child"].pop((parent, toks), None)


def catch_up():
    drain(300)
    for r in range(ranks):
        st = state[r]
        while st["next"] in live[r] or st["next"] in replayed[r]:
            apply(r, live[r].get(st["next"]) or replayed[r][st["next"]])
            st["next"] += 1


def predict(r, ids, block_size):
    parent, k = None, 0
    while (k + 1) * block_size <= len(ids):
        h = state[r]["child"].get((parent, tuple(ids[k * block_size:(k + 1) * block_size])))
        if h is None:
            break
        parent, k = h, k + 1
    return k * block_size


def post(path, body):
    req = urllib.request.Request(base + path, method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


replayed = [replay(r, 0) for r in range(ranks)]
catch_up()
block_size, hits = 16, 0
for i, subject in enumerate([s for wave in waves for s in wave][:6]):
    ids = post("/tokenize", {"prompt": f"Tell me a story about {subject}. " * 5})["tokens"]
    for r in (i % ranks, i % ranks, (i + 1) % ranks):
        catch_up()
        want = predict(r, ids, block_size)
        usage = post("/v1/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0,
                                         "attention_dp_rank": r, "attention_dp_relax": False})["usage"]
        got = usage["prompt_tokens_details"]["cached_tokens"]
        check(want <= got < want + block_size and got < len(ids),
              f"rank {r}: the events predict {want} cached tokens of {len(ids)}, the server reused {got}")
        hits += want > 0
check(hits >= 6, f"only {hits} predictions found a cached prefix: the check exercises nothing")
print(f"{hits} of 18 pinned prompts found a cached prefix the events predicted")
drain(1000)  # until the publishers are quiet: the last request's events come after its answer


result = {}
for r in range(ranks):
    seen = dict(live[r])
    # The first batch this subscriber missed (a gap, or the tail after it left): a replay from
    # there fills everything; a replay from 0 must equal what came live, byte for byte.
    start = next((s for s in range(max(seen) + 2) if s not in seen), 0) if seen else 0
    for s, p in replay(r, start).items():
        seen.setdefault(s, p)
    full = replay(r, 0)
    check(len(full) > 0, f"rank {r} published nothing")
    for s, p in live[r].items():
        check(full.get(s) == p, f"rank {r} seq {s}: the replayed batch differs from the live one")
    check(sorted(full) == list(range(len(full))), f"rank {r}: replayed sequence numbers {sorted(full)[:5]}... not 0..n-1")
    check(set(seen) == set(full), f"rank {r}: live + replayed {len(seen)} batches != published {len(full)}")
    missed = len(set(full) - set(live[r]))
    if r == 1:
        check(missed > 0, "rank 1's subscriber dropped out, yet it missed nothing: the test exercises nothing")
    stored, removed = [], []
    for s in sorted(full):
        batch = decoder.decode(full[s])
        check(batch.data_parallel_rank == r, f"rank {r} seq {s}: data_parallel_rank {batch.data_parallel_rank}")
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                check(ev.medium == "GPU" and ev.lora_id is None and ev.lora_name is None, f"stored {ev}")
                check(len(ev.token_ids) == ev.block_size * len(ev.block_hashes), f"stored tokens {ev}")
                stored.append({"hashes": ev.block_hashes, "parent": ev.parent_block_hash, "tokens": ev.token_ids})
            elif isinstance(ev, BlockRemoved):
                removed.append(ev.block_hashes)
    result[str(r)] = {"stored": stored, "removed": removed, "live": len(live[r]), "missed": missed}

with open(out_path, "w") as f:
    json.dump(result, f)
print("OK")
