#!/usr/bin/env python3
"""What Hugging Face transformers computes for an encoder checkpoint directory (RoBERTa, XLM-RoBERTa,
DistilBERT, ALBERT, ELECTRA, BERT, ...): the reference that directories trainbook exports are checked
against (they must load in transformers and give the same outputs).

As a module (tests put tests/encoders on sys.path, or import it by path):
    outputs(model_dir, task, input_ids, attention_mask, token_type_ids=None) -> dict[str, Tensor]
        task: base | sequence | token | qa | mlm, loaded with AutoModel |
        AutoModelForSequenceClassification | AutoModelForTokenClassification |
        AutoModelForQuestionAnswering | AutoModelForMaskedLM; the outputs, float32, under the names
        tests/fixtures/encoders/*/expected.safetensors uses:
            base: last_hidden_state [batch, seq, hidden]   sequence: logits [batch, num_labels]
            token: logits [batch, seq, num_labels]         qa: start_logits, end_logits [batch, seq]
            mlm: logits [batch, seq, vocab]
    load(model_dir, task) -> the model (eval mode; cached)
input_ids / attention_mask / token_type_ids: a list of ids, a list of rows, or an int64 tensor [seq] /
[batch, seq]. token_type_ids are passed to models whose forward takes them; for one that does not
(DistilBERT) all-zero token_type_ids are dropped and any other value is an error.
The model is loaded with AutoModelFor<task>.from_pretrained(model_dir, dtype=float32), eager
attention, eval mode. Loading fails (HfCheckError) when config.json's `architectures` does not name
the class the task's Auto class maps its config to (e.g. task mlm on a RobertaForSequenceClassification
export), or when the checkpoint leaves parameters missing (transformers would initialise them at
random), has unexpected or mismatched-shape tensors, or transformers cannot read it.

As a program (torch needs the CUDA stubs on a CPU machine, hence scripts/torch-python.sh):
    scripts/torch-python.sh tests/encoders/hf_check.py --model DIR --task TASK \\
        --inputs IN.safetensors --out OUT.safetensors
    scripts/torch-python.sh tests/encoders/hf_check.py --batch JOBS.json
        (a list of {"model", "task", "inputs", "out"}: the same checks in one process)
        reads input_ids, attention_mask and (if present) token_type_ids (int64 [batch, seq]) from IN,
        writes the task's outputs (float32, names as above) to OUT, prints
        {"out": OUT, "architectures": [...from config.json...], "shapes": {name: [...]}} as JSON.
        Exit status 2 with "hf_check.py: error: ..." on stderr when the directory does not load (see above).
The program runs torch on one thread, as tests/fixtures/make_encoder_parity.py does, so its numbers
are bit-identical to the fixtures'; pass --threads to change that.
"""
import argparse
import functools
import inspect
import json
import os
import sys

import torch

ATTN = "eager"
AUTO_CLASSES = {
    "base": "AutoModel",
    "sequence": "AutoModelForSequenceClassification",
    "token": "AutoModelForTokenClassification",
    "qa": "AutoModelForQuestionAnswering",
    "mlm": "AutoModelForMaskedLM",
}
OUTPUT_NAMES = {
    "base": ("last_hidden_state",),
    "sequence": ("logits",),
    "token": ("logits",),
    "qa": ("start_logits", "end_logits"),
    "mlm": ("logits",),
}
TASKS = tuple(AUTO_CLASSES)


class HfCheckError(Exception):
    """The directory does not load as the task's transformers model."""


def _config_json(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise HfCheckError(f"{model_dir}: no config.json") from None
    except (OSError, ValueError) as e:
        raise HfCheckError(f"{path}: cannot read: {e}") from None


def architectures(model_dir):
    """config.json's `architectures` (a list of class names; [] when absent)."""
    return list(_config_json(os.fspath(model_dir)).get("architectures") or [])


def _auto(task):
    if task not in AUTO_CLASSES:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    import transformers

    return getattr(transformers, AUTO_CLASSES[task])


@functools.lru_cache(maxsize=8)
def _load(model_dir, task, attn_implementation):
    import transformers

    auto = _auto(task)
    archs = architectures(model_dir)
    try:
        config = transformers.AutoConfig.from_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001 - any failure to read is the answer
        raise HfCheckError(f"{model_dir}: transformers cannot read config.json: {type(e).__name__}: {e}") from None
    try:
        expected_cls = auto._model_mapping[type(config)]
    except KeyError:
        raise HfCheckError(f"{model_dir}: {AUTO_CLASSES[task]} has no class for model_type "
                           f"{getattr(config, 'model_type', '?')!r} ({type(config).__name__})") from None
    if archs != [expected_cls.__name__]:
        raise HfCheckError(f"{model_dir}: config.json architectures {archs} is not [{expected_cls.__name__!r}], "
                           f"the class {AUTO_CLASSES[task]} (task {task!r}) loads for model_type "
                           f"{config.model_type!r}")
    try:
        model, info = auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn_implementation,
                                           output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        raise HfCheckError(f"{model_dir}: {AUTO_CLASSES[task]}.from_pretrained failed: {type(e).__name__}: {e}") from None
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = info.get(key) or []
        if found:
            problems.append(f"{key.replace('_', ' ')}: {sorted(map(str, found))}")
    if problems:
        raise HfCheckError(f"{model_dir}: {type(model).__name__} does not load cleanly: " + "; ".join(problems))
    if type(model) is not expected_cls:
        raise HfCheckError(f"{model_dir}: loaded {type(model).__name__}, expected {expected_cls.__name__}")
    return model.eval()


def load(model_dir, task, attn_implementation=ATTN):
    """The task's transformers model made of the directory, in eval mode (cached)."""
    _auto(task)
    return _load(os.path.abspath(os.fspath(model_dir)), task, attn_implementation)


def _ids(name, ids):
    t = ids.detach().clone() if isinstance(ids, torch.Tensor) else torch.tensor(ids)
    t = t.to(torch.int64)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[1] == 0:
        raise ValueError(f"{name} must be [seq] or [batch, seq] with seq > 0, got shape {list(t.shape)}")
    return t


def outputs(model_dir, task, input_ids, attention_mask, token_type_ids=None, attn_implementation=ATTN):
    """The task model's outputs for the batch: {name: float32 tensor}, eval mode, no grad."""
    model = load(model_dir, task, attn_implementation)
    kw = {"input_ids": _ids("input_ids", input_ids), "attention_mask": _ids("attention_mask", attention_mask)}
    if kw["attention_mask"].shape != kw["input_ids"].shape:
        raise ValueError(f"attention_mask shape {list(kw['attention_mask'].shape)} != input_ids shape "
                         f"{list(kw['input_ids'].shape)}")
    if token_type_ids is not None:
        tt = _ids("token_type_ids", token_type_ids)
        if tt.shape != kw["input_ids"].shape:
            raise ValueError(f"token_type_ids shape {list(tt.shape)} != input_ids shape {list(kw['input_ids'].shape)}")
        if "token_type_ids" in inspect.signature(model.forward).parameters:
            kw["token_type_ids"] = tt
        elif tt.any():
            raise ValueError(f"{type(model).__name__} takes no token_type_ids, and these are not all 0")
    with torch.no_grad():
        out = model(**kw)
    return {name: getattr(out, name).detach().float().contiguous() for name in OUTPUT_NAMES[task]}


def run_one(model, task, inputs_path, out_path, attn=ATTN):
    """One check: the outputs of `model` for the inputs in `inputs_path`, written to `out_path`.
    Returns (exit status, the JSON line or the error message)."""
    from safetensors.torch import load_file, save_file

    try:
        inputs = load_file(inputs_path)
    except Exception as e:  # noqa: BLE001
        return 2, f"hf_check.py: error: {inputs_path}: cannot read: {type(e).__name__}: {e}"
    for name in ("input_ids", "attention_mask"):
        if name not in inputs:
            return 2, f"hf_check.py: error: {inputs_path}: no {name} (has {sorted(inputs)})"
    try:
        out = outputs(model, task, inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids"), attn)
    except (HfCheckError, ValueError) as e:
        return 2, f"hf_check.py: error: {model}: {e}"
    save_file(out, out_path)
    return 0, json.dumps({"out": out_path, "architectures": architectures(model),
                          "shapes": {k: list(v.shape) for k, v in out.items()}})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (from_pretrained)")
    p.add_argument("--task", choices=TASKS)
    p.add_argument("--inputs", help="safetensors with int64 input_ids, attention_mask [, token_type_ids]")
    p.add_argument("--out", help="safetensors file to write")
    p.add_argument("--batch", help="a JSON list of {model, task, inputs, out}: every check in one process "
                                   "(torch and transformers load once); stops at the first that fails")
    p.add_argument("--attn", default=ATTN, help=f"attention implementation (default {ATTN})")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a = p.parse_args(argv)
    if a.batch:
        with open(a.batch) as f:
            jobs = [(j["model"], j["task"], j["inputs"], j["out"]) for j in json.load(f)]
    elif a.model and a.task and a.inputs and a.out:
        jobs = [(a.model, a.task, a.inputs, a.out)]
    else:
        p.error("give --model, --task, --inputs and --out, or --batch")

    torch.set_num_threads(a.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()  # problems are reported from the loading info instead
    for job in jobs:
        rc, line = run_one(*job, a.attn)
        print(line, file=sys.stderr if rc else sys.stdout)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
