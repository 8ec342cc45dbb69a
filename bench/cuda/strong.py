#!/usr/bin/env python3
"""The strong PyTorch baselines trainbook's GPU speed is judged against: what a careful PyTorch
engineer writes, eager and with torch.compile, on one GPU, bf16 autocast, batches made on the
device (the model's speed, not a loader's):

  bert-eager, bert-compiled      BERT-base masked-LM at 128 tokens: one fused q/k/v projection,
                                 scaled_dot_product_attention, the MLM head only on the masked
                                 positions (torch.gather of --predictions per row, as NVIDIA's and
                                 Habana's BERT do), fused AdamW (lr 5e-5, weight decay 0.01),
                                 dropout 0.1 as BERT's, the vocabulary of trainbook's default tokenizer.
  resnet-nchw, resnet-cl,        torchvision ResNet-50 at 224 px, NCHW or channels-last, fused
  resnet-cl-compiled             AdamW (lr 1e-3), inputs already on the GPU as uint8 and normalised
                                 there (as trainbook's loader hands them).

  python3 bench/cuda/strong.py [--only NAME,...] [--batch-bert 256] [--batch-resnet 256]

One JSON line per run on stdout: samples/s of the median step after --warmup (each step timed
with CUDA events) and of the mean, the peak of torch.cuda.max_memory_allocated, the loss.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, h, heads, drop):
        super().__init__()
        self.heads, self.drop = heads, drop
        self.qkv = nn.Linear(h, 3 * h)
        self.out = nn.Linear(h, h)
        self.ln1 = nn.LayerNorm(h, eps=1e-12)
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)
        self.ln2 = nn.LayerNorm(h, eps=1e-12)

    def forward(self, x, bias):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.drop if self.training else 0.0)
        a = a.transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + F.dropout(self.out(a), self.drop, self.training))
        return self.ln2(x + F.dropout(self.down(F.gelu(self.up(x))), self.drop, self.training))


class BertMlm(nn.Module):
    def __init__(self, vocab=30522, h=768, layers=12, heads=12, drop=0.1, positions=512):
        super().__init__()
        self.word = nn.Embedding(vocab, h)
        self.pos = nn.Embedding(positions, h)
        self.typ = nn.Embedding(2, h)
        self.ln = nn.LayerNorm(h, eps=1e-12)
        self.drop = drop
        self.layers = nn.ModuleList(Layer(h, heads, drop) for _ in range(layers))
        self.transform = nn.Linear(h, h)
        self.ln_head = nn.LayerNorm(h, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab))
        for m in self.modules():  # BERT's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids, mask, positions, labels):
        b, s = ids.shape
        x = self.word(ids) + self.pos.weight[:s] + self.typ.weight[0]
        x = F.dropout(self.ln(x), self.drop, self.training)
        # mask None: blocks cut from concatenated texts have no padding, and SDPA may then take
        # flash attention.
        bias = None if mask is None else torch.zeros(b, 1, 1, s, device=ids.device, dtype=x.dtype).masked_fill(~mask[:, None, None, :], torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, bias)
        # The head on the masked positions only.
        picked = torch.gather(x, 1, positions[..., None].expand(-1, -1, x.shape[-1]))
        y = self.ln_head(F.gelu(self.transform(picked)))
        logits = y @ self.word.weight.t() + self.bias
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def bert_batch(b, s, vocab, predictions, dev):
    ids = torch.randint(min(1000, vocab // 2), vocab, (b, s), device=dev)  # past the special tokens
    mask = None  # full blocks, no padding
    positions = torch.rand(b, s, device=dev).argsort(dim=1)[:, :predictions]
    labels = torch.gather(ids, 1, positions)
    ids = ids.scatter(1, positions, 103)  # [MASK]
    return ids, mask, positions, labels


def timed(step, steps, warmup):
    times = []
    for i in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = step()
        e.record()
        e.synchronize()
        if i >= warmup:
            times.append(s.elapsed_time(e) / 1e3)
    return times, float(loss)


def bert(args, compiled):
    dev = "cuda"
    torch.manual_seed(0)
    model = BertMlm(vocab=args.vocab).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    fwd = torch.compile(model) if compiled else model
    batches = [bert_batch(args.batch_bert, 128, args.vocab, args.predictions, dev) for _ in range(8)]
    it = iter(range(10**9))

    def step():
        ids, mask, pos, labels = batches[next(it) % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids, mask, pos, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return timed(step, args.steps, args.warmup), args.batch_bert


def resnet(args, channels_last, compiled):
    import torchvision
    dev = "cuda"
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(dev).train()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    fwd = torch.compile(model) if compiled else model
    b = args.batch_resnet
    images = torch.randint(0, 256, (b, 3, 224, 224), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, 1000, (b,), device=dev)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def step():
        x = ((images.float() - mean) / std).contiguous(memory_format=fmt)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return timed(step, args.steps, args.warmup), b


RUNS = {
    "bert-eager": lambda a: bert(a, False),
    "bert-compiled": lambda a: bert(a, True),
    "resnet-nchw": lambda a: resnet(a, False, False),
    "resnet-cl": lambda a: resnet(a, True, False),
    "resnet-cl-compiled": lambda a: resnet(a, True, True),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(RUNS))
    p.add_argument("--batch-bert", type=int, default=256)
    p.add_argument("--batch-resnet", type=int, default=256)
    p.add_argument("--predictions", type=int, default=20)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    for name in args.only.split(","):
        if name not in RUNS:
            sys.exit(f"strong.py: no run {name!r}; runs: {', '.join(RUNS)}")
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        started = time.monotonic()
        (times, loss), batch = RUNS[name](args)
        print(json.dumps({
            "name": name, "batch": batch, "steps_timed": len(times),
            "samples_per_second_median_step": batch / statistics.median(times),
            "samples_per_second_after_warmup": batch * len(times) / sum(times),
            "cuda_max_memory_allocated": torch.cuda.max_memory_allocated(),
            "final_loss": loss if math.isfinite(loss) else None,
            "wall_seconds": time.monotonic() - started,
            "torch": torch.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
