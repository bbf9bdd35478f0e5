#!/usr/bin/env python3
"""PyTorch's side of //tools/bench:train_step on a GPU: the same models, optimizers and batches.

Times whole training steps (forward, cross-entropy, backward, optimizer step) of the mlp
(784-256-128-10, SGD momentum 0.9, a fixed random batch of 28x28 images) or GPT-2 124M (as
nanoGPT writes it: tied head, tanh GELU, fused qkv, AdamW lr 6e-4 weight decay 0.1, on fixed
random tokens), each step ending in a device synchronisation, as train_step's do. PyTorch at its
best eager configuration: scaled_dot_product_attention (flash or memory-efficient kernels),
AdamW fused=True, TF32 off (both sides' float32 default); --autocast=bf16 runs the forward
under torch.autocast as train_step's --autocast does.

    python3 tools/gpu/torch_train_step.py --model=gpt2 --batch_size=8 --tokens=1024 --steps=10

The last line is one JSON object (step_ms_median, p10, p90), as train_step's last line.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    # 50257 tokens padded to 50304 (a multiple of 64) as nanoGPT does, and as Tandem's GPT does
    # (examples/gpt.h, GptConfig::vocab_multiple); the tokens stay below 50257.
    def __init__(self, vocab=50304, context=1024, layers=12, heads=12, c=768):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(context, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--batch_size", type=int, default=0, help="0: 256 images or 4 sequences")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--autocast", choices=["", "bf16"], default="")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"expected --steps >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")

    torch.manual_seed(0)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.model == "mlp":
        batch = args.batch_size or 256
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                              nn.ReLU(), nn.Linear(128, 10)).to(device)
        inputs = torch.randn(batch, 1, 28, 28, device=device)
        targets = torch.randint(0, 10, (batch,), device=device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_of = lambda out: F.cross_entropy(out, targets)
    else:
        batch = args.batch_size or 4
        model = Gpt2().to(device)
        inputs = torch.randint(0, 50257, (batch, args.tokens), device=device)
        targets = torch.randint(0, 50257, (batch, args.tokens), device=device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
        loss_of = lambda out: F.cross_entropy(out.view(-1, out.shape[-1]), targets.view(-1))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss = loss_of(model(inputs))
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
        print(f"\rstep {i + 1}/{args.steps}", end="", flush=True)
    times.sort()
    median = statistics.median(times)
    p10 = times[int(0.1 * (len(times) - 1))]
    p90 = times[int(0.9 * (len(times) - 1))]
    print(f"\rPyTorch {torch.__version__} {args.model} batch {batch}"
          f"{' tokens %d' % args.tokens if args.model == 'gpt2' else ''}"
          f"{' autocast ' + args.autocast if args.autocast else ''} on "
          f"{torch.cuda.get_device_name(device)}: step {median:.2f} ms median "
          f"(p10 {p10:.2f}, p90 {p90:.2f}) over {args.steps} steps")
    print(json.dumps({"benchmark": "torch_train_step", "model": args.model, "batch_size": batch,
                      "tokens": args.tokens, "autocast": args.autocast, "steps": args.steps,
                      "step_ms_median": round(median, 3), "step_ms_p10": round(p10, 3),
                      "step_ms_p90": round(p90, 3), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
