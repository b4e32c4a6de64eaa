"""The PyTorch side of the benchmarks against PyTorch 1.13 (Debian's python3-torch): the GPT-2 of
configs/bench-gpt2.yaml written plainly (pre-LayerNorm, tanh GELU, tied head, masked-softmax
attention, as torch 1.13 has no fused attention), with GPT-2's init as tessel uses, and AdamW
with decay on matrices only. Used by bench/train_vs_pytorch.py and bench/ddp_vs_pytorch.py.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def gpt2_with_adamw(n_layer, n_embd, n_head, vocab_size, seq_len, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1):
    """Returns (model, optimizer); model(idx, targets) gives the mean cross-entropy loss."""
    L, C, H, V, T = n_layer, n_embd, n_head, vocab_size, seq_len

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            s.c_attn, s.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            # a plain attribute, not a buffer: gloo (DDP) cannot broadcast bool tensors, and a
            # constant mask has nothing to sync (tessel does not sync it either)
            s.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

        def forward(s, x):
            b, t, c = x.shape
            q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
            q, k, v = [z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = F.softmax(att.masked_fill(~s.mask[:t, :t], float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + s.attn_proj(y)
            return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(s):
            super().__init__()
            s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            s.h = nn.ModuleList([Block() for _ in range(L)])
            s.ln_f = nn.LayerNorm(C)

        def forward(s, idx, targets):
            x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
            for blk in s.h:
                x = blk(x)
            logits = F.linear(s.ln_f(x), s.wte.weight)
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    model = GPT()
    for m in model.modules():  # GPT-2's init, as tessel uses, so both start from a loss near ln(vocab)
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=1e-8)
    return model, opt
