#!/usr/bin/env python3
"""Writes the committed seed corpora of fuzz/corpus/ (except checkpoint's, which
fuzz_checkpoint writes itself: TESSEL_FUZZ_WRITE_SEEDS=fuzz/corpus/checkpoint). Small valid
inputs of each reader, plus a few near misses, so a brief run starts past the first checks.

    fuzz/make_seeds.py [ROOT]   (default: the folder of this script)
"""
import json
import os
import struct
import sys

root = os.path.join(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)), "corpus")
src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- json: every kind of value, escapes, big and small numbers, deep nesting
put("json", "object", '{"a": [1, -2, 3.5, 1e-300, 9223372036854775807, -9223372036854775808], "b": {"c": null}}')
put("json", "strings", r'["plain", "esc \" \\ \/ \b \f \n \r \t", "\u00e9\u4e2d\ud83d\ude00", ""]')
put("json", "literals", '[true, false, null, 0, -0, 0.0, 1E+2, 18446744073709551616]')
put("json", "nested", "[" * 40 + "]" * 40)
put("json", "trainer", json.dumps({"step": 3, "seed": 1337, "arch": "gpt2",
                                   "settings": {"train.lr": "0.002"}, "config": {"model": {"n_layer": 4}}}))
put("json", "bad_trailing", '{"a": 1,}')

# ---- safetensors: header length, JSON header, data
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
put("safetensors", "f32", safetensors({"w": ("F32", [2, 3], f32)}, {"format": "pt", "step": "3"}))
put("safetensors", "mixed", safetensors({"a": ("BF16", [4], struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0)),
                                         "b": ("I64", [2], struct.pack("<2q", -1, 7)),
                                         "c": ("F16", [2], struct.pack("<2H", 0x3C00, 0xC000)),
                                         "d": ("BOOL", [3], b"\x01\x00\x01"),
                                         "e": ("F64", [1, 1], struct.pack("<d", 0.5)),
                                         "f": ("I32", [0, 5], b"")}))
put("safetensors", "empty", safetensors({}))
put("safetensors", "short", safetensors({"w": ("F32", [2, 3], f32)})[:-4])

# ---- config: the shipped configs, and one with overrides after NUL bytes
for name in ("gpt2-tiny.yaml", "llama-tiny.yaml"):
    with open(os.path.join(src, "configs", name)) as f:
        put("config", name, f.read())
put("config", "overrides", "model: {arch: gpt2, n_layer: 2, n_embd: 32, n_head: 2}\n"
    "train: {steps: 5, global_batch: 4, seq_len: 16, lr: 1.0e-3}\n"
    "parallel: {dp: 2, tp: 1, pp: 2, micro_batches: 2, schedule: 1F1B, sharding_stage: 1}\n"
    "\0train.lr=3e-4\0parallel.dp=1\0model.n_head=4")
put("config", "anchors", "model: &m {arch: gpt2, n_layer: 1, n_embd: 8, n_head: 2}\nextra: *m\n")

# ---- cluster: YAML (minimal and full) and preset specs ('@' + spec)
minimal = """name: small
nodes: 2
devices_per_node: 8
dtype: bf16
device:
  name: A100-SXM4-80GB
  peak_flops: {bf16: 312e12, f32: 19.5e12}
  memory_bytes: 80e9
  memory_bandwidth: 2.039e12
intra: {kind: nvswitch, bandwidth: 300e9, latency: 5e-6}
inter: {kind: infiniband, bandwidth: 25e9, latency: 10e-6}
"""
put("cluster", "minimal", minimal)
put("cluster", "full", minimal + """total_devices: 12
cores_per_node: 4
nics_per_node: 8
calibration:
  gemm_efficiency: 0.8
  gemm_half_dim: 96
  gemm_size: 4096
  memory_efficiency: 0.85
  link_efficiency: 0.9
  op_overhead: 5e-6
  attention_efficiency: 0.5
  fused_attention: true
  fragmentation: 1.1
  reserved_bytes: 2e9
  sources: {peak_flops: measured, links: "nccl-tests"}
""")
for spec in ("dgx-a100-80g", "dgx-h100:16", "h200:8", "dgx-a100-40g:3"):
    put("cluster", "preset-" + spec.replace(":", "-"), "@" + spec)

# ---- store: first byte odd = the server has the token "fuzz-token"; then request frames
def frame(body):
    return struct.pack("<I", len(body)) + body

def s(x):
    x = x.encode()
    return struct.pack("<I", len(x)) + x

HELLO, SET, GET, ADD, WAIT, CAS, DELETE, CHECK = range(1, 9)
session = (frame(bytes([HELLO]) + s("fuzz-token")) + frame(bytes([SET]) + s("k") + s("v")) +
           frame(bytes([GET]) + s("k") + struct.pack("<q", 0)) + frame(bytes([ADD]) + s("n") + struct.pack("<q", 5)) +
           frame(bytes([ADD]) + s("k") + struct.pack("<q", 1)) +
           frame(bytes([CAS]) + s("k") + s("v") + s("w")) + frame(bytes([CHECK]) + struct.pack("<I", 2) + s("k") + s("n")) +
           frame(bytes([WAIT]) + struct.pack("<I", 1) + s("n") + struct.pack("<q", 0)) + frame(bytes([DELETE]) + s("k")) +
           frame(bytes([GET]) + s("gone") + struct.pack("<q", 0)))
put("store", "session-token", b"\x01" + session)
put("store", "session-open", b"\x00" + session[len(frame(bytes([HELLO]) + s("fuzz-token"))):])
put("store", "wrong-token", b"\x01" + frame(bytes([HELLO]) + s("guess")) + frame(bytes([SET]) + s("k") + s("v")))
put("store", "no-hello", b"\x01" + frame(bytes([SET]) + s("k") + s("v")))
put("store", "parks", b"\x00" + frame(bytes([GET]) + s("later") + struct.pack("<q", 60000)) + frame(bytes([SET]) + s("later") + s("x")))
