#!/usr/bin/env python3
"""A Hugging Face export of a tessel checkpoint loads in PyTorch 1.13 and gives tessel's logits.

Trains GPT-2 and Llama (tiny) for 3 steps on 4 thread ranks (dp2·tp2, ZeRO-2, and tp2·pp2),
saves, exports with `tessel ckpt export`, reads the exported model.safetensors and config.json
with nothing but the file format (an 8-byte header length, a JSON header, raw little-endian
data) into a plain PyTorch model written from Hugging Face's definitions of GPT2LMHeadModel
and LlamaForCausalLM, and compares its logits for a batch with tessel's (logits_main) to 1e-4.
Skipped (exit 77) when PyTorch is not installed, except under ./run.sh test, which installs it
(scripts/install-deps.sh --test) and sets TESSEL_TEST_REQUIRE_TORCH: there its absence fails.
  hf_export_torch.py TESSEL_BINARY LOGITS_MAIN SOURCE_DIR
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    if os.environ.get("TESSEL_TEST_REQUIRE_TORCH"):  # ./run.sh test installed it: its absence is a failure
        print("PyTorch is not installed, but scripts/install-deps.sh --test should have installed it")
        sys.exit(1)
    print("PyTorch is not installed: skipped")
    sys.exit(77)

tessel, logits_main, src = sys.argv[1:4]
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[8 + n + a:8 + n + b], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def gpt2_logits(w, c, ids):
    C, H = c["n_embd"], c["n_head"]
    p = lambda k: w["transformer." + k]
    ln = lambda x, k: F.layer_norm(x, (C,), p(k + ".weight"), p(k + ".bias"), c["layer_norm_epsilon"])
    conv1d = lambda x, k: x @ p(k + ".weight") + p(k + ".bias")  # HF's Conv1D: [in, out]
    B, T = ids.shape
    x = p("wte.weight")[ids] + p("wpe.weight")[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(c["n_layer"]):
        h = f"h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=2)
        q, k, v = [z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + conv1d((att @ v).transpose(1, 2).reshape(B, T, C), h + "attn.c_proj")
        x = x + conv1d(F.gelu(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh"), h + "mlp.c_proj")
    return ln(x, "ln_f") @ p("wte.weight").T  # tied head


def llama_logits(w, c, ids):
    C, H, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    p = lambda k: w["model." + k] if ("model." + k) in w else w[k]
    rms = lambda x, k: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]) * p(k + ".weight")
    lin = lambda x, k: x @ p(k + ".weight").T  # nn.Linear: [out, in]
    B, T = ids.shape
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()
    rot = lambda z: torch.cat([-z[..., D // 2:], z[..., :D // 2]], -1)
    rope = lambda z: z * cos + rot(z) * sin
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = p("embed_tokens.weight")[ids]
    for i in range(c["num_hidden_layers"]):
        h = f"layers.{i}."
        y = rms(x, h + "input_layernorm")
        q = lin(y, h + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = lin(y, h + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
        v = lin(y, h + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        att = F.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~mask, float("-inf")), -1)
        x = x + lin((att @ v).transpose(1, 2).reshape(B, T, C), h + "self_attn.o_proj")
        y = rms(x, h + "post_attention_layernorm")
        x = x + lin(F.silu(lin(y, h + "mlp.gate_proj")) * lin(y, h + "mlp.up_proj"), h + "mlp.down_proj")
    return rms(x, "norm") @ w["lm_head.weight"].T


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


cases = [
    ("gpt2", ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_positions=32"],
     ["parallel.dp=2", "parallel.tp=2", "parallel.sharding_stage=2"]),
    ("llama", ["model.num_hidden_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
               "model.num_key_value_heads=2", "model.intermediate_size=96", "model.max_position_embeddings=32"],
     ["parallel.tp=2", "parallel.pp=2", "parallel.micro_batches=2"]),
]
with tempfile.TemporaryDirectory() as tmp:
    for arch, model_sets, layout in cases:
        config = os.path.join(src, "configs", f"{arch}-tiny.yaml")
        sets = model_sets + ["train.steps=3", "train.seq_len=16", "train.global_batch=8", "train.micro_batch=8",
                             "train.warmup=0", "train.lr=0.01"]
        flags = [f for s in sets for f in ("--set", s)]
        ck, out = os.path.join(tmp, arch + "-ck"), os.path.join(tmp, arch + "-hf")
        run(tessel, "train", config, *flags, *[f for s in layout for f in ("--set", s)], "--save", ck)
        run(tessel, "ckpt", "export", ck, out)
        run(logits_main, config, os.path.join(ck, "step-000003"), os.path.join(tmp, arch + ".logits"), *flags)
        want = read_safetensors(os.path.join(tmp, arch + ".logits"))
        w = read_safetensors(os.path.join(out, "model.safetensors"))
        c = json.load(open(os.path.join(out, "config.json")))
        with torch.no_grad():
            got = (gpt2_logits if arch == "gpt2" else llama_logits)(w, c, want["ids"])
        diff = (got - want["logits"]).abs().max().item() / want["logits"].abs().max().item()
        print(f"{arch} saved by {' '.join(layout)}: {c['architectures'][0]} in PyTorch {torch.__version__}, "
              f"logits {list(got.shape)}, max difference {diff:.1e} of the largest logit")
        if diff > 1e-4:
            sys.exit(f"{arch}: the exported model's logits differ from tessel's by {diff:.1e}")
