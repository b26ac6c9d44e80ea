"""The GPT of models/src/gpt.cpp in PyTorch, op for op, for the bench scripts that compare with it
(pytorch_side_by_side.py on the CPU, pytorch_gpu_reference.py on a CUDA device); and the ops that
PyTorch's selective checkpointing keeps in those comparisons."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------
# The GPT of models/src/gpt.cpp. Same ops, same dropout calls in the same order (embed; per block:
# attention probabilities, attention projection, MLP), same local-variable lifetimes (they decide
# which temporaries are alive at the peak). `sdpa=True` replaces the attention core (scores,
# mask, softmax, dropout, probs @ v) by one F.scaled_dot_product_attention call: PyTorch 2.x's way,
# not remat's model, so only PyTorch-only strategies use it.

class Block(nn.Module):
    def __init__(self, hidden, heads, seq, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.register_buffer("causal_mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

    def core_attention(self, qkv_out, sdpa=False):
        b, t, c = qkv_out.shape[0], qkv_out.shape[1], qkv_out.shape[2] // 3
        hs = c // self.heads
        split = qkv_out.split(c, 2)
        q = split[0].view(b, t, self.heads, hs).transpose(1, 2)  # (B,NH,T,HS)
        k = split[1].view(b, t, self.heads, hs).transpose(1, 2)
        v = split[2].view(b, t, self.heads, hs).transpose(1, 2)
        if sdpa:
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                                      is_causal=True)
            return attended.transpose(1, 2).contiguous().view(b, t, c)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
        scores = scores.masked_fill(self.causal_mask[:t, :t], float("-inf"))
        probs = scores.softmax(-1)
        probs = F.dropout(probs, self.dropout, self.training)
        return probs.matmul(v).transpose(1, 2).contiguous().view(b, t, c)  # (B,T,C)

    def attention_half(self, x, sdpa=False):
        qkv_out = self.qkv(self.ln1(x))
        attended = self.core_attention(qkv_out, sdpa)
        return x + F.dropout(self.proj(attended), self.dropout, self.training)

    def mlp_half(self, x):
        out = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(out, self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, dropout, vocabulary=256):  # bytes, as remat's corpus
        super().__init__()
        self.dropout = dropout
        self.wte = nn.Embedding(vocabulary, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, seq, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocabulary, bias=False)

    def embed(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        return F.dropout(x, self.dropout, self.training)

    def loss(self, x, targets):
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def sac_policy_ops():
    """The ops whose outputs selective checkpointing keeps: every matmul and attention kernel."""
    ops = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        packet = getattr(torch.ops.aten, name, None)  # which exist depends on the version and build
        if packet is not None:
            ops.append(packet.default)
    return ops


def check_run_args(parser, args):
    """The bench scripts' shared checks of the GPT's shape and the rounds (argparse errors)."""
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.hidden % args.heads:
        parser.error(f"--heads ({args.heads}) must divide --hidden ({args.hidden})")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
