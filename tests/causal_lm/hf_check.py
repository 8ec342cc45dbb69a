#!/usr/bin/env python3
"""What Hugging Face transformers (and peft) compute for a causal-LM checkpoint directory: the
reference trainbook's Rust GPT-2 / Llama-family models are compared with.

As a module (tests put tests/causal_lm on sys.path, or import it by path):
    logits(model_dir, input_ids, adapter_dir=None) -> torch.Tensor   float32 [batch, seq, vocab]
    greedy(model_dir, prompt_ids, max_new_tokens, adapter_dir=None) -> list[int]
        the whole sequence generate() returns (prompt first), stopping early at the
        generation config's eos as transformers does
input_ids / prompt_ids: a list of ids, a list of rows, or an int64 tensor [seq] / [batch, seq].
The model is loaded with AutoModelForCausalLM.from_pretrained(model_dir, dtype=float32) (`dtype`
is transformers 5's name for the old `torch_dtype`), eager attention, eval mode; with adapter_dir
it is wrapped by peft.PeftModel.from_pretrained(base, adapter_dir). Loaded models are cached.

As a program (torch needs the CUDA stubs on a CPU machine, hence scripts/torch-python.sh):
    scripts/torch-python.sh tests/causal_lm/hf_check.py logits --model DIR [--adapter DIR] \\
        --ids 1,2,3[;4,5,6] --out FILE.safetensors
        writes input_ids (int64 [batch, seq]) and logits (float32 [batch, seq, vocab]) to FILE,
        prints {"out": FILE, "shape": [...]} as JSON
    scripts/torch-python.sh tests/causal_lm/hf_check.py greedy --model DIR [--adapter DIR] \\
        --ids 1,2,3 --max-new-tokens N
        prints {"ids": [prompt + new], "new_ids": [...]} as JSON
The program runs torch on one thread, as tests/fixtures/make_causal_lm_parity.py does, so its
numbers are bit-identical to the fixtures'; pass --threads to change that.
"""
import argparse
import functools
import json
import os
import sys

import torch

ATTN = "eager"


@functools.lru_cache(maxsize=8)
def load(model_dir, adapter_dir=None, attn_implementation=ATTN):
    """The model transformers (and peft, with adapter_dir) makes of the directories, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.fspath(model_dir), dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    if adapter_dir is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, os.fspath(adapter_dir))
    return model.eval()


def _ids(ids):
    t = ids.detach().clone() if isinstance(ids, torch.Tensor) else torch.tensor(ids)
    t = t.to(torch.int64)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[1] == 0:
        raise ValueError(f"ids must be [seq] or [batch, seq] with seq > 0, got shape {list(t.shape)}")
    return t


def _key(path):
    return None if path is None else os.path.abspath(os.fspath(path))


def logits(model_dir, input_ids, adapter_dir=None, attn_implementation=ATTN):
    """model(input_ids).logits: float32 [batch, seq, vocab], no attention mask, no grad."""
    model = load(_key(model_dir), _key(adapter_dir), attn_implementation)
    with torch.no_grad():
        return model(input_ids=_ids(input_ids)).logits.float().contiguous()


def greedy(model_dir, prompt_ids, max_new_tokens, adapter_dir=None, attn_implementation=ATTN):
    """generate(do_sample=False) for one prompt: the prompt ids followed by the new ones."""
    ids = _ids(prompt_ids)
    if ids.shape[0] != 1:
        raise ValueError("greedy takes one prompt")
    model = load(_key(model_dir), _key(adapter_dir), attn_implementation)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=int(max_new_tokens))
    return [int(i) for i in out[0].tolist()]


def _parse_ids(text):
    rows = [[int(x) for x in row.split(",") if x.strip()] for row in text.split(";") if row.strip()]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise argparse.ArgumentTypeError(f"--ids: comma-separated ids, rows of equal length separated by ';': {text!r}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("logits", "greedy"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True, help="checkpoint directory (from_pretrained)")
        s.add_argument("--adapter", help="peft adapter directory (PeftModel.from_pretrained)")
        s.add_argument("--ids", required=True, type=_parse_ids, help="1,2,3 (rows separated by ';' for logits)")
        s.add_argument("--attn", default=ATTN, help=f"attention implementation (default {ATTN})")
        s.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
        if name == "logits":
            s.add_argument("--out", required=True, help="safetensors file to write")
        else:
            s.add_argument("--max-new-tokens", type=int, required=True)
    a = p.parse_args(argv)

    torch.set_num_threads(a.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if a.cmd == "logits":
        from safetensors.torch import save_file

        ids = _ids(a.ids)
        out = logits(a.model, ids, a.adapter, a.attn)
        save_file({"input_ids": ids.contiguous(), "logits": out}, a.out)
        print(json.dumps({"out": a.out, "shape": list(out.shape)}))
    else:
        if len(a.ids) != 1:
            p.error("greedy takes one row of --ids")
        ids = greedy(a.model, a.ids, a.max_new_tokens, a.adapter, a.attn)
        print(json.dumps({"ids": ids, "new_ids": ids[len(a.ids[0]):]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
