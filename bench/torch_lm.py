#!/usr/bin/env python3
"""PyTorch-eager baseline: causal-LM training throughput (tokens/s), full fine-tuning or LoRA
through PEFT, one process, for the side-by-side with trainbook's causal-lm recipe.

Same workload as `trainbook train causal-lm --model DIR --from-scratch --workers 1`:
AutoModelForCausalLM from DIR's config.json with random weights (fp32, the default sdpa
attention), blocks of --block tokens (every token predicted), --batch blocks a step, AdamW
(lr 1e-4; PyTorch's default foreach implementation on CPU, its fused kernel on CUDA),
torch.set_num_threads(--threads); --device cuda --precision bf16 for the GPU (autocast, as
trainbook's bf16, the blocks already on the GPU). With
--lora-rank R, PEFT's LoRA (alpha 2R, dropout 0.05) on q_proj, k_proj, v_proj, o_proj, the
base frozen, as trainbook's default targets. Token values do not change the work: the blocks
are drawn at random once, before timing.

Times --steps steps after --warmup, and prints one JSON line on stdout:
{"tokens_per_second": ..., "steps": ..., "final_loss": ..., "trainable": ...}.

  scripts/torch-python.sh bench/torch_lm.py --model DIR --threads 2 [--lora-rank 8]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a directory with config.json")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast, as trainbook's")
    a = p.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    config = AutoConfig.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if a.lora_rank:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.05,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    device = torch.device(a.device)
    model.to(device).train()
    params = [q for q in model.parameters() if q.requires_grad]
    # PyTorch done well on a GPU: the fused AdamW kernel, the data already on the device.
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, config.vocab_size, (a.steps + a.warmup, a.batch, a.block), generator=g).to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    loss = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            start = time.perf_counter()
        ids = blocks[i]
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "tokens_per_second": a.steps * a.batch * a.block / seconds,
        "steps": a.steps,
        "final_loss": loss.item(),
        "trainable": sum(q.numel() for q in params),
        "threads": a.threads,
        "lora_rank": a.lora_rank,
        "device": a.device,
        "precision": a.precision,
        "peak_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }))


if __name__ == "__main__":
    sys.exit(main())
