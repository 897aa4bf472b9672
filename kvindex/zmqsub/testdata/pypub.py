#!/usr/bin/env python3
"""Independent KV event publisher for kvindex tests: pyzmq + msgpack, written from
vLLM's wire format (vllm/distributed/kv_events.py), sharing no code with the Go side.

Binds a PUB and a ROUTER on 127.0.0.1 (random ports), prints
"READY <pub endpoint> <replay endpoint>", then for each line on stdin:
  "probe"  publish an empty batch (the subscriber waits until one arrives)
  "go"     publish the scenario: 4 batches, the 2nd one NOT sent (a gap the subscriber
           must replay), events as maps (vLLM >= 0.26), the last one a legacy array
  "quit"   exit
The replay ROUTER answers ["", seq8] with ["", topic, seq8, payload]... and the end marker.
"""
import struct
import sys
import threading
import time

import msgpack
import zmq

BS = 4
TOPIC = b"kv@127.0.0.1:9@m"


def toks(start, n):
    return list(range(start, start + n * BS))


def stored(hashes, parent, tokens):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BS, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": None, "group_idx": 0,
            "kv_cache_spec_kind": "full_attention"}


def main():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    lock = threading.Lock()
    buf = []  # (seq, payload)
    seq = [0]

    def publish(events, send=True):
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        with lock:
            s = seq[0]
            seq[0] += 1
            buf.append((s, payload))
        if send:
            pub.send_multipart([TOPIC, struct.pack(">Q", s), payload])

    def publish_legacy(event_array):
        payload = msgpack.packb([time.time(), [event_array], 0], use_bin_type=True)
        with lock:
            s = seq[0]
            seq[0] += 1
            buf.append((s, payload))
        pub.send_multipart([TOPIC, struct.pack(">Q", s), payload])

    stop = threading.Event()

    def serve_replay():
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if not dict(poller.poll(50)):
                continue
            ident, _, s8 = router.recv_multipart()
            start = struct.unpack(">Q", s8)[0]
            with lock:
                out = [(s, p) for (s, p) in buf if s >= start]
            for s, p in out:
                router.send_multipart([ident, b"", TOPIC, struct.pack(">Q", s), p])
            router.send_multipart([ident, b"", b"", b"\xff" * 8, b""])

    t = threading.Thread(target=serve_replay, daemon=True)
    t.start()
    print("READY", pub.getsockopt_string(zmq.LAST_ENDPOINT), router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "probe":
            publish([])
        elif cmd == "go":
            publish([stored([101, 102], None, toks(0, 2))])
            publish([stored([103], 102, toks(8, 1))], send=False)  # lost: replay it
            publish([{"type": "BlockRemoved", "block_hashes": [101 + 0x10000], "medium": "GPU", "group_idx": 0},
                     stored([-5], None, toks(500, 1))])  # negative int64 hash (vLLM <= 0.10.1)
            publish_legacy(["BlockStored", [b"\x07" * 32], None, toks(900, 1), BS, None, "CPU"])  # bin hash, 7 fields
            print("DONE", flush=True)
        elif cmd == "quit":
            break
    stop.set()
    t.join()
    pub.close()
    router.close()
    ctx.term()


if __name__ == "__main__":
    main()
