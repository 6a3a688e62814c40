#!/usr/bin/env python3
"""What priority scheduling buys an urgent request behind a queue.

Against a running `worker serve` (e.g. `--ranks 1 --max-active-per-rank 4
--scheduling-policy priority`): 24 low-priority completions (priority 5,
48 tokens each) are sent at once, and 1 s later 3 urgent ones (priority -1,
16 tokens). Prints the urgent requests' end-to-end latencies and the low
ones' median and maximum, in seconds. With --fcfs the requests carry no
priority (for a server under the default --scheduling-policy fcfs).

usage: scripts/priority-demo.py BASE_URL MODEL [--fcfs]
"""
import json
import statistics
import sys
import threading
import time
import urllib.request

base, model = sys.argv[1], sys.argv[2]
fcfs = "--fcfs" in sys.argv[3:]
lat = {"low": [], "urgent": []}


def run(kind, priority, tokens):
    body = {"model": model, "prompt": "Once upon a time, " * 8, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}
    if not fcfs:
        body["priority"] = priority
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.load(r)
    lat[kind].append(time.time() - t0)


low = [threading.Thread(target=run, args=("low", 5, 48)) for _ in range(24)]
for t in low:
    t.start()
time.sleep(1.0)
urgent = [threading.Thread(target=run, args=("urgent", -1, 16)) for _ in range(3)]
for t in urgent:
    t.start()
for t in low + urgent:
    t.join()
print(json.dumps({"urgent_s": [round(x, 2) for x in sorted(lat["urgent"])],
                  "low_median_s": round(statistics.median(lat["low"]), 2), "low_max_s": round(max(lat["low"]), 2)}))
