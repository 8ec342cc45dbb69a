//! Causal LMs as users train them: the tiny models `transformers` wrote in
//! tests/fixtures/causal_lm, fine-tuned in full and with LoRA by real worker processes,
//! checkpoints that are Hugging Face / PEFT directories, generation from the CLI, and one
//! clear error before any worker starts for each kind of bad input.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tch::Tensor;
use trainbook::recipes::causal_lm::inference;
use trainbook::{
    Configure, ConfigureLm, ConfigureText, ConfigureTraining, LmTrainer, Train, TrainResult,
};

use crate::common::{last_model, load, max_abs_diff, scratch, wait_until};

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/causal_lm")
        .join(arch)
}

/// A few hundred lines of plain text, written once per test process.
fn text() -> PathBuf {
    let file = scratch("causal-lm-data").join("stories.txt");
    if !file.exists() {
        let (who, did, what) = (
            [
                "the cat",
                "a dog",
                "the quick brown fox",
                "my neighbour",
                "the old sailor",
            ],
            ["saw", "chased", "painted", "found", "remembered"],
            [
                "the moon",
                "a red ball",
                "the lazy dog",
                "an open door",
                "the harbour at night",
            ],
        );
        let lines: Vec<String> = (0..300)
            .map(|i| {
                format!(
                    "{} {} {}.",
                    who[i % 5],
                    did[(i / 5) % 5],
                    what[(i / 25) % 5]
                )
            })
            .collect();
        std::fs::write(&file, lines.join("\n")).unwrap();
    }
    file
}

fn jsonl(name: &str, lines: &[serde_json::Value]) -> PathBuf {
    let file = scratch("causal-lm-data").join(name);
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    file
}

fn job(arch: &str, workers: usize) -> LmTrainer {
    LmTrainer::new()
        .workers(workers)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(scratch("causal-lm-runs"))
        .model(fixture(arch).display().to_string())
        .data(text().display().to_string())
        .max_length(16)
        .global_batch_size(4)
        .lr(1e-2)
        .seed(5)
}

/// The logits of `ids` from the model (and adapter) a directory holds, as trainbook loads it.
fn logits(model: &Path, adapter: Option<&Path>, ids: &Tensor) -> Tensor {
    let lm = inference::load(model, adapter, tch::Device::Cpu).unwrap();
    tch::no_grad(|| lm.model.logits(&lm.model.hidden(ids, None, false)))
}

/// The logits `transformers` (and `peft`, over `adapter`) computes for `ids` from a directory
/// trainbook wrote: tests/causal_lm/hf_check.py in the project venv.
fn hf_logits(model: &Path, adapter: Option<&Path>, ids: &Tensor) -> Tensor {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = scratch("causal-lm-hf").join(format!("logits-{}.safetensors", rand_suffix()));
    let row: Vec<i64> = Vec::try_from(ids.view([-1])).unwrap();
    let row: Vec<String> = row.iter().map(|i| i.to_string()).collect();
    let mut cmd = Command::new(repo.join("scripts/torch-python.sh"));
    cmd.arg(repo.join("tests/causal_lm/hf_check.py"))
        .args(["logits", "--model"])
        .arg(model)
        .args(["--ids", &row.join(","), "--out"])
        .arg(&out);
    if let Some(a) = adapter {
        cmd.arg("--adapter").arg(a);
    }
    let done = cmd.output().unwrap();
    assert!(
        done.status.success(),
        "hf_check.py: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    load(&out)
        .into_iter()
        .find(|(n, _)| n == "logits")
        .unwrap()
        .1
}

/// `trainbook generate --json` on `model` with `args`: (the prompt's ids, the new ids, stdout).
fn generate(model: &Path, args: &[&str]) -> (Vec<i64>, Vec<i64>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainbook"))
        .args(["generate", "--json", "--model"])
        .arg(model)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = crate::common::last_json(&out);
    let ids = |k: &str| serde_json::from_value(json[k].clone()).unwrap();
    (
        ids("prompt_ids"),
        ids("new_ids"),
        String::from_utf8_lossy(&out.stdout).into(),
    )
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

fn ids() -> Tensor {
    Tensor::from_slice(&[5i64, 17, 42, 99, 3, 250, 7, 8]).view([1, -1])
}

fn checkpoint(r: &TrainResult) -> PathBuf {
    r.last_checkpoint.clone().expect("a checkpoint")
}

#[test]
fn lora_on_two_workers_equals_one_and_its_checkpoint_is_a_peft_adapter() {
    // No adapter dropout: its masks are drawn per rank, so they differ with the worker count.
    let run = |w| {
        job("llama", w)
            .lora_rank(4)
            .lora_dropout(0.0)
            .max_steps(8)
            .fit()
            .unwrap()
    };
    let (one, two) = (run(1), run(2));
    assert_eq!((one.steps, two.steps), (8, 8));
    let diff = max_abs_diff(&last_model(&one), &last_model(&two));
    assert!(diff < 1e-5, "adapters differ by {diff}");
    assert!(one.final_train_loss.is_finite());

    // The checkpoint holds the adapters only (8 projections x A, B), PEFT's files beside them.
    let ckpt = checkpoint(&one);
    let saved = load(&ckpt.join("model.safetensors"));
    assert_eq!(
        saved.len(),
        2 * 4 * 2,
        "{:?}",
        saved.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    assert!(saved.iter().all(|(n, _)| n.contains(".lora_")));
    let peft = load(&ckpt.join("adapter_model.safetensors"));
    for ((a, x), (b, y)) in saved.iter().zip(&peft) {
        assert_eq!(format!("base_model.model.{a}"), *b);
        assert!(x.equal(y));
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 8.0);
    assert_eq!(config["peft_type"], "LORA");

    // The checkpoint alone (it names its base) gives the trained model; trained B moved the
    // base's logits; exported and merged, the same function.
    let base = logits(&fixture("llama"), None, &ids());
    let tuned = logits(&ckpt, None, &ids());
    let moved = (&tuned - &base).abs().max().double_value(&[]);
    assert!(moved > 1e-4, "LoRA training changed nothing ({moved})");
    // What peft makes of the checkpoint over the same base: the same function.
    let adapter = scratch("causal-lm-export").join("adapter");
    inference::export(&ckpt, &adapter, false).unwrap();
    let d = (&hf_logits(&fixture("llama"), Some(&adapter), &ids()) - &tuned)
        .abs()
        .max()
        .double_value(&[]);
    assert!(d <= 1e-4, "peft's logits differ from trainbook's by {d}");
    // Greedy generation with the adapter: peft's `generate(do_sample=False)` token for token.
    let adapter_arg = adapter.display().to_string();
    let (prompt, new, _) = generate(
        &fixture("llama"),
        &[
            "--adapter",
            &adapter_arg,
            "--prompt",
            "the cat saw",
            "--greedy",
            "--max-new-tokens",
            "10",
        ],
    );
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let hf = Command::new(repo.join("scripts/torch-python.sh"))
        .arg(repo.join("tests/causal_lm/hf_check.py"))
        .args(["greedy", "--model"])
        .arg(fixture("llama"))
        .arg("--adapter")
        .arg(&adapter)
        .args(["--max-new-tokens", "10", "--ids"])
        .arg(
            prompt
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
        .output()
        .unwrap();
    assert!(
        hf.status.success(),
        "{}",
        String::from_utf8_lossy(&hf.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&hf.stdout).unwrap();
    assert_eq!(
        serde_json::json!(new),
        theirs["new_ids"],
        "greedy tokens with the adapter"
    );
    let merged = scratch("causal-lm-export").join("merged");
    inference::export(&ckpt, &merged, true).unwrap();
    assert!(!merged.join("adapter_config.json").exists());
    let d = (&logits(&merged, None, &ids()) - &tuned)
        .abs()
        .max()
        .double_value(&[]);
    assert!(d < 1e-4, "merged model differs by {d}");
}

#[test]
fn full_fine_tuning_on_completions_writes_a_transformers_directory() {
    let pairs: Vec<serde_json::Value> = (0..40)
        .map(|i| serde_json::json!({"prompt": format!("review {i}: the film was"), "completion": if i % 2 == 0 { " fresh" } else { " rotten" }}))
        .collect();
    let data = jsonl("reviews.jsonl", &pairs);
    let r = job("gpt2", 2)
        .data(data.display().to_string())
        .max_length(24)
        .max_steps(5)
        .fit()
        .unwrap();
    assert_eq!(r.steps, 5);
    let ckpt = checkpoint(&r);
    // The fixture's own tensor names (what transformers saved), and its config and tokenizer.
    let names = |p: &Path| load(p).into_iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(
        names(&ckpt.join("model.safetensors")),
        names(&fixture("gpt2").join("model.safetensors"))
    );
    for f in ["config.json", "tokenizer.json", "generation_config.json"] {
        assert!(ckpt.join(f).exists(), "{f} missing from {}", ckpt.display());
    }
    let out = scratch("causal-lm-export").join("gpt2-full");
    inference::export(&ckpt, &out, false).unwrap();
    let d = (&logits(&out, None, &ids()) - &logits(&ckpt, None, &ids()))
        .abs()
        .max()
        .double_value(&[]);
    assert!(d == 0.0, "the export differs from the checkpoint by {d}");
    let d = (&hf_logits(&out, None, &ids()) - &logits(&ckpt, None, &ids()))
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        d <= 1e-4,
        "transformers' logits of the export differ from trainbook's by {d}"
    );
}

/// The memory levers change where memory goes, not the result: activation checkpointing and
/// ZeRO-2 end where plain data parallelism ends.
#[test]
fn checkpointing_and_zero_2_equal_plain_data_parallelism() {
    let run = |t: LmTrainer| t.max_steps(6).fit().unwrap();
    let plain = run(job("gpt2", 2));
    let levers = run(job("gpt2", 2).activation_checkpointing(true).zero(2));
    let lora = |t: LmTrainer| run(t.lora_rank(2).lora_dropout(0.0));
    let (lora_plain, lora_levers) = (
        lora(job("llama", 2)),
        lora(job("llama", 2).activation_checkpointing(true).zero(2)),
    );
    for (a, b) in [(&plain, &levers), (&lora_plain, &lora_levers)] {
        let d = max_abs_diff(&last_model(a), &last_model(b));
        eprintln!("{} vs {}: {d}", a.run_dir.display(), b.run_dir.display());
    }
}

#[test]
fn zero_3_equals_plain_data_parallelism_in_full_and_lora_fine_tuning() {
    // GPT-2 (its head tied to the embeddings, both in the root unit) with a global clip;
    // Llama with two micro-batches a step and a clip; Llama with LoRA on 3 workers, every
    // layer recomputed (the frozen base sharded too).
    let run = |t: LmTrainer| t.max_steps(6).fit().unwrap();
    let full = |t: LmTrainer| t.grad_accum(2).grad_clip(0.5);
    let lora = |t: LmTrainer| t.lora_rank(2).lora_dropout(0.0).global_batch_size(6);
    let pairs = [
        (
            run(job("gpt2", 2).grad_clip(0.5)),
            run(job("gpt2", 2).grad_clip(0.5).zero(3)),
        ),
        (
            run(full(job("llama", 2))),
            run(full(job("llama", 2).zero(3))),
        ),
        (
            run(lora(job("llama", 3))),
            run(lora(job("llama", 3).zero(3).activation_checkpointing(true))),
        ),
        // The bf16 base each rank casts its slice of.
        (
            run(lora(job("llama", 2).precision(trainbook::Precision::Bf16))),
            run(lora(
                job("llama", 2)
                    .precision(trainbook::Precision::Bf16)
                    .zero(3),
            )),
        ),
    ];
    for (a, b) in &pairs {
        let d = max_abs_diff(&last_model(a), &last_model(b));
        assert!(
            d < 1e-5,
            "{} vs {}: {d}",
            a.run_dir.display(),
            b.run_dir.display()
        );
        // Each rank holds its shards of the parameters, the frozen base's too.
        let whole = a.memory[0].parameters as f64;
        let workers = b.memory.len() as f64;
        for m in &b.memory {
            let share = m.parameters as f64 / whole;
            assert!((share - 1.0 / workers).abs() < 0.02, "{share}: {m:?}");
        }
    }
    // The full fine-tune's checkpoint is sharded, a file per rank with an index; its export
    // is copied, and transformers computes the plain run's logits from it. The LoRA one is
    // the adapter, written whole.
    let (plain, sharded) = (checkpoint(&pairs[1].0), checkpoint(&pairs[1].1));
    assert!(!sharded.join("model.safetensors").exists());
    assert!(sharded.join("model-00002-of-00002.safetensors").exists());
    assert!(checkpoint(&pairs[2].1)
        .join("adapter_model.safetensors")
        .exists());
    let out = scratch("causal-lm-export").join("llama-zero3");
    inference::export(&sharded, &out, false).unwrap();
    let d = (&hf_logits(&out, None, &ids()) - &logits(&plain, None, &ids()))
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        d <= 1e-4,
        "transformers' logits of the ZeRO-3 export differ by {d}"
    );
}

#[test]
fn a_zero3_model_built_from_scratch_a_layer_at_a_time_starts_where_plain_data_parallelism_does() {
    // Each ZeRO-3 rank draws every layer as a replicated build does, keeps its slice and
    // frees the rest: after the same steps the weights are plain data parallelism's.
    let run = |t: LmTrainer| t.from_scratch(true).max_steps(3).fit().unwrap();
    let (plain, sharded) = (run(job("llama", 2)), run(job("llama", 2).zero(3)));
    let d = max_abs_diff(&last_model(&plain), &last_model(&sharded));
    assert!(d < 1e-5, "{d}");
}

#[test]
fn a_killed_lora_worker_under_zero3_restarts_and_ends_like_the_straight_run() {
    // Under ZeRO-3 the restarted ranks build their slices of the base again, read only those
    // from the model's files, and resume the adapters from the last checkpoint.
    let spec = || {
        job("qwen2", 2)
            .zero(3)
            .lora_rank(2)
            .epochs(20)
            .max_steps(60)
            .checkpoint_every(10)
    };
    let job_ = spec().max_failures(1).launch().unwrap();
    assert!(
        wait_until(Duration::from_secs(120), || job_
            .progress()
            .is_some_and(|p| p.step >= 25)),
        "the job never reached step 25"
    );
    kill(Pid::from_raw(job_.pids()[1] as i32), Signal::SIGKILL).unwrap();
    let restarted = job_.wait().expect("the job restarts and succeeds");
    assert_eq!(restarted.restarts.len(), 1, "{:?}", restarted.restarts);
    let straight = spec().fit().unwrap();
    let diff = max_abs_diff(&last_model(&restarted), &last_model(&straight));
    assert!(diff <= 1e-5, "adapters differ by {diff}");
}

/// Each bad input is refused while planning (no worker started, nothing written), naming the
/// problem and the fix.
#[test]
fn bad_input_is_one_clear_error_before_any_worker_starts() {
    let err = |t: LmTrainer| format!("{:#}", t.plan().unwrap_err());
    let e = err(job("llama", 1).lora_rank(4).lora_targets("query,value"));
    assert!(e.contains("'query'") && e.contains("q_proj"), "{e}");

    let chat = jsonl(
        "chat.jsonl",
        &[
            serde_json::json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}),
        ],
    );
    let e = err(job("llama", 1).data(chat.display().to_string()));
    assert!(e.contains("no chat_template"), "{e}");

    let long = jsonl(
        "long.jsonl",
        &[
            serde_json::json!({"prompt": "the quick brown fox jumps over the lazy dog ".repeat(8), "completion": " yes"}),
        ],
    );
    let e = err(job("llama", 1)
        .data(long.display().to_string())
        .max_length(16));
    assert!(e.contains("max_length") && e.contains("record 1"), "{e}");

    let e = err(job("mistral", 1).max_length(48));
    assert!(
        e.contains("sliding_window of 32") && e.contains("max_length 32 or less"),
        "{e}"
    );

    // A shard missing from a sharded checkpoint.
    let partial = scratch("causal-lm-partial").join("llama");
    std::fs::create_dir_all(&partial).unwrap();
    for f in std::fs::read_dir(fixture("llama")).unwrap().flatten() {
        if !f.file_name().to_string_lossy().contains("00002") {
            std::fs::copy(f.path(), partial.join(f.file_name())).unwrap();
        }
    }
    let e = err(job("llama", 1).model(partial.display().to_string()));
    assert!(
        e.contains("model-00002-of-00003.safetensors") && e.contains("not there"),
        "{e}"
    );

    // A causal LM given to the BERT recipe is named for what it is.
    let bert = trainbook::BertTrainer::new()
        .preset("tiny")
        .model(fixture("llama").display().to_string());
    let e = format!("{:#}", bert.plan().unwrap_err());
    assert!(e.contains("llama") && e.contains("causal-lm"), "{e}");
}

/// `trainbook generate`, greedy, equals transformers' `generate(do_sample=False)` token for
/// token (the fixture's greedy_ids).
#[test]
fn the_cli_generates_what_transformers_generates() {
    for arch in ["gpt2", "llama"] {
        let dir = fixture(arch);
        let want: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join("expected.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        let prompt: Vec<i64> = Vec::try_from(want["prompt_ids"].view([-1])).unwrap();
        let greedy: Vec<i64> = Vec::try_from(want["greedy_ids"].view([-1])).unwrap();
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let steps = (greedy.len() - prompt.len()).to_string();
        let (ids, new, stdout) = generate(
            &dir,
            &[
                "--prompt",
                expected["prompt"].as_str().unwrap(),
                "--greedy",
                "--max-new-tokens",
                &steps,
            ],
        );
        assert_eq!(ids, prompt, "{arch}: the prompt's tokens");
        assert_eq!([ids, new].concat(), greedy, "{arch}: greedy tokens");
        // The text (of a random model: mostly pieces of characters) before the JSON line.
        assert_eq!(stdout.lines().count(), 2, "{arch}");
    }
}

/// The qwen2 fixture with a chat template in its tokenizer_config.json (a short one in
/// Qwen2's form; tests/fixtures' tokenizers were saved without one).
fn qwen2_with_template() -> PathBuf {
    let dir = scratch("causal-lm-chat").join("qwen2");
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture("qwen2")).unwrap().flatten() {
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let file = dir.join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    config["chat_template"] = serde_json::json!(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    );
    std::fs::write(&file, config.to_string()).unwrap();
    dir
}

#[test]
fn chat_data_trains_with_the_template_and_generate_renders_it() {
    let model = qwen2_with_template();
    let chats: Vec<serde_json::Value> = (0..24)
        .map(|i| {
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("{i} even?")},
                {"role": "assistant", "content": if i % 2 == 0 { "yes" } else { "no" }},
            ]})
        })
        .collect();
    let data = jsonl("chats.jsonl", &chats);
    let r = job("qwen2", 1)
        .model(model.display().to_string())
        .data(data.display().to_string())
        .max_length(64)
        .lora_rank(2)
        .max_steps(4)
        .fit()
        .unwrap();
    assert_eq!(r.steps, 4);
    // Only the assistants' answers (and what closes their turns) are trained on.
    let log = std::fs::read_to_string(r.run_dir.join("logs/rank0.log")).unwrap();
    assert!(log.contains("of them trained on"), "{log}");

    // --chat renders the conversation with the template's generation prompt: the same tokens
    // as that text given as a plain prompt (this tokenizer adds no special tokens of its own).
    let run = |args: &[&str]| {
        let (prompt, new, _) = generate(&model, &[&["--max-new-tokens", "5"], args].concat());
        (prompt, new)
    };
    let chat = run(&["--chat", "--prompt", "3?"]);
    let plain = run(&[
        "--prompt",
        "<|im_start|>user\n3?<|im_end|>\n<|im_start|>assistant\n",
    ]);
    assert_eq!(chat, plain);
}
