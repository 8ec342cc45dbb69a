//! The memory plan's view of an encoder: its parameters and the activations one micro-batch
//! keeps, counted from the shapes the way autograd keeps them in [`super::stack`]'s forward
//! pass. Counted as BERT's layout (a table per layer); ALBERT's shared layers count once per
//! use here, an overestimate of its parameters.

use super::config::EncoderConfig;

/// The head an encoder footprint is planned with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Head {
    /// `BertForSequenceClassification` with this many labels (pooler and classifier).
    Classifier(i64),
    /// `BertForMaskedLM`, scoring this many positions per sequence (the masked ones).
    MaskedLm { predictions: f64 },
}

/// How one micro-batch runs, for [`EncoderConfig::footprint`].
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    pub batch: u64,
    pub seq: u64,
    /// Bytes of an activation element: 4 (fp32) or 2 (bf16 autocast).
    pub element: u64,
    /// Bytes of an element of the residual stream (the LayerNorms' inputs and outputs): 4 on
    /// CPU and CUDA, whose autocast runs LayerNorm in fp32; the activation's on Gaudi, whose
    /// autocast runs it in bf16.
    pub norm: u64,
    /// Bytes per element of a dropout mask: CPU keeps the scaled noise (an activation element),
    /// CUDA's and Gaudi's fused dropout a byte mask.
    pub mask: u64,
    /// Whether dropout is on (p > 0).
    pub dropout: bool,
    /// A fused attention kernel (saves q, k, v, the output and a row statistic) instead of the
    /// written-out one (saves the scores, the softmax and its dropout).
    pub fused_attention: bool,
    /// Activation checkpointing of every k-th layer.
    pub checkpoint_every: Option<usize>,
}

/// Activation bytes of one micro-batch, by part, and the parameter tensors, for the memory plan.
pub struct EncoderFootprint {
    /// (name, elements) of every trainable tensor, sorted by name.
    pub tensors: Vec<(String, u64)>,
    /// Elements of the weights bf16 autocast copies (every matrix a matmul reads).
    pub cast_by_autocast: u64,
    pub activations: Vec<(String, u64)>,
}

impl EncoderConfig {
    /// The parameters and the activations of a micro-batch, counted from the shapes the way
    /// autograd keeps them in this file's forward pass (checked against torch's saved-tensor
    /// hooks: the count of one layer matches to the tensor).
    pub fn footprint(&self, head: Head, run: &RunShape) -> EncoderFootprint {
        let (h, i, v, l) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
            self.num_hidden_layers as u64,
        );
        let mut tensors: Vec<(String, u64)> = vec![
            ("bert.embeddings.word_embeddings.weight".into(), v * h),
            (
                "bert.embeddings.position_embeddings.weight".into(),
                self.max_position_embeddings as u64 * h,
            ),
            (
                "bert.embeddings.token_type_embeddings.weight".into(),
                self.type_vocab_size as u64 * h,
            ),
            ("bert.embeddings.LayerNorm.weight".into(), h),
            ("bert.embeddings.LayerNorm.bias".into(), h),
        ];
        for k in 0..l {
            let p = format!("bert.encoder.layer.{k}");
            for (name, n) in [
                ("attention.self.query.weight", h * h),
                ("attention.self.query.bias", h),
                ("attention.self.key.weight", h * h),
                ("attention.self.key.bias", h),
                ("attention.self.value.weight", h * h),
                ("attention.self.value.bias", h),
                ("attention.output.dense.weight", h * h),
                ("attention.output.dense.bias", h),
                ("attention.output.LayerNorm.weight", h),
                ("attention.output.LayerNorm.bias", h),
                ("intermediate.dense.weight", i * h),
                ("intermediate.dense.bias", i),
                ("output.dense.weight", h * i),
                ("output.dense.bias", h),
                ("output.LayerNorm.weight", h),
                ("output.LayerNorm.bias", h),
            ] {
                tensors.push((format!("{p}.{name}"), n));
            }
        }
        let mut cast = l * (4 * h * h + 2 * h * i);
        match head {
            Head::Classifier(labels) => {
                let labels = labels.max(1) as u64;
                tensors.extend([
                    ("bert.pooler.dense.weight".into(), h * h),
                    ("bert.pooler.dense.bias".into(), h),
                    ("classifier.weight".into(), labels * h),
                    ("classifier.bias".into(), labels),
                ]);
                cast += h * h + labels * h;
            }
            Head::MaskedLm { .. } => {
                tensors.extend([
                    ("cls.predictions.transform.dense.weight".into(), h * h),
                    ("cls.predictions.transform.dense.bias".into(), h),
                    ("cls.predictions.transform.LayerNorm.weight".into(), h),
                    ("cls.predictions.transform.LayerNorm.bias".into(), h),
                    ("cls.predictions.bias".into(), v),
                ]);
                // The decoder reads the word embeddings as a matrix.
                cast += h * h + v * h;
            }
        }
        tensors.sort();
        EncoderFootprint {
            tensors,
            cast_by_autocast: cast,
            activations: self.activations(head, run),
        }
    }

    /// Bytes one micro-batch keeps at the start of its backward pass, by part.
    fn activations(&self, head: Head, r: &RunShape) -> Vec<(String, u64)> {
        let (h, i, v, l, a) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
            self.num_hidden_layers as u64,
            self.num_attention_heads as u64,
        );
        let tokens = r.batch * r.seq;
        let (e, inter, scores) = (tokens * h, tokens * i, r.batch * a * r.seq * r.seq);
        let (w, n, fp32) = (r.element, r.norm, 4);
        let masks = |n: u64| if r.dropout { n * r.mask } else { 0 };
        // One layer: its input; q, k, v (copies the attention's matmuls read); the scores, their
        // softmax and its dropout (written out) or the output and row statistics (fused); the
        // context; the two residual sums that enter the LayerNorms and the attention output
        // between them (in the residual stream's dtype); the feed-forward input and its
        // GELU; two dropout masks.
        let attention = if r.fused_attention {
            2 * e * w + r.batch * a * r.seq * fp32
        } else {
            e * w + scores * w + if r.dropout { scores * (r.mask + w) } else { 0 }
        };
        let layer = e * n + 3 * e * w + attention + 3 * e * n + 2 * inter * w + masks(2 * e);
        let every = r.checkpoint_every.map(|k| k.max(1) as u64);
        // A checkpointed layer keeps its input only, and is recomputed (all of its
        // activations) when the backward pass reaches it: by then the layers after it are
        // freed, and so is the head, whose backward pass ran first. So a recomputation adds
        // to the peak only when no plain layer follows the last checkpointed one, and then it
        // takes the head's place rather than adding to it.
        let (kept, recompute) = match every {
            Some(k) if l > 0 => {
                let checkpointed = l.div_ceil(k);
                let after_last = l - 1 - (l - 1) / k * k;
                let recompute = if after_last == 0 { layer } else { 0 };
                (checkpointed * e * n + (l - checkpointed) * layer, recompute)
            }
            Some(_) => (0, 0),
            None => (l * layer, 0),
        };
        let embeddings = e * n + masks(e);
        let mut parts = vec![
            ("embeddings".to_string(), embeddings),
            (
                match every {
                    Some(k) => format!("{l} layers (every {k}. recomputed)"),
                    None => format!("{l} layers"),
                },
                kept,
            ),
        ];
        // The backward pass's working set inside a layer: the gradients of the feed-forward
        // activations and of the residual stream.
        parts.push(("backward working set".into(), (2 * inter + 2 * e) * w));
        let (name, bytes) = match head {
            Head::MaskedLm { predictions } => {
                let m = (predictions * r.batch as f64).ceil() as u64;
                // The picked positions through the transform (4 tensors of m x h), the
                // log-softmax over the vocabulary, and in the backward pass two more m x v
                // gradients and the decoder's weight gradient (v x h, held until the tied
                // word embeddings take it).
                (
                    format!("masked-LM head ({m} positions x {v})"),
                    4 * m * h * w + m * v * fp32 + 2 * m * v * fp32 + v * h * fp32,
                )
            }
            Head::Classifier(labels) => (
                "classification head".into(),
                r.batch * (3 * h + 2 * labels.max(1) as u64) * fp32,
            ),
        };
        parts.push(if recompute > bytes {
            (
                format!("a recomputed layer (more than the {name})"),
                recompute,
            )
        } else if recompute > 0 {
            (format!("{name}, or a recomputed layer"), bytes)
        } else {
            (name, bytes)
        });
        parts
    }
}

/// The memory plan's view of a BERT job: its tensors and one micro-batch's activations on the
/// job's device, with its precision, dropout and checkpointing.
pub fn plan_footprint(
    config: &EncoderConfig,
    head: Head,
    seq: u64,
    h: &trainbook_api::Hyper,
    layout: &trainbook_engine::Layout,
) -> trainbook_api::Footprint {
    use trainbook_api::DeviceKind;
    use trainbook_api::Precision;
    let element = if h.precision == Precision::Bf16 { 2 } else { 4 };
    let dropout = h.dropout > 0.0;
    let run = RunShape {
        batch: layout.batch_per_device as u64,
        seq,
        element,
        norm: if layout.device == DeviceKind::Hpu {
            element
        } else {
            4
        },
        // CPU dropout keeps its scaled noise in the activation's dtype; CUDA's and Gaudi's
        // fused dropout a byte mask.
        mask: if layout.device == DeviceKind::Cpu {
            element
        } else {
            1
        },
        dropout,
        // Gaudi runs the written-out attention (see `math_attention`); CUDA's fused kernels
        // take dropout, CPU's only without it.
        fused_attention: match layout.device {
            DeviceKind::Hpu => false,
            DeviceKind::Cuda => true,
            DeviceKind::Cpu => !dropout,
        },
        checkpoint_every: h
            .activation_checkpointing
            .then_some(h.checkpoint_layers_every.max(1)),
    };
    let f = config.footprint(head, &run);
    trainbook_api::Footprint {
        model: format!(
            "{}, {} layers, hidden {}, {} heads, vocabulary {}, {seq} tokens",
            config.family().name,
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.vocab_size
        ),
        trainable: f.tensors.iter().map(|t| t.1).collect(),
        cast_by_autocast: f.cast_by_autocast,
        frozen_bytes: 0,
        units: trainbook_engine::unit_sizes(f.tensors.iter().map(|(n, e)| (n.as_str(), e * 4))),
        activations: f.activations,
    }
}

#[cfg(test)]
mod footprint_tests {
    use super::*;

    fn bert_1_5b() -> EncoderConfig {
        EncoderConfig {
            hidden_size: 1600,
            num_hidden_layers: 48,
            num_attention_heads: 25,
            intermediate_size: 6400,
            ..EncoderConfig::tiny(30522, 512)
        }
    }

    #[test]
    fn bert_1_5b_has_the_parameters_of_its_name() {
        let f = bert_1_5b().footprint(
            Head::MaskedLm { predictions: 20.0 },
            &RunShape {
                batch: 32,
                seq: 128,
                element: 2,
                norm: 2,
                mask: 1,
                dropout: true,
                fused_attention: false,
                checkpoint_every: None,
            },
        );
        let total: u64 = f.tensors.iter().map(|t| t.1).sum();
        // Embeddings 49,660,800; 48 layers of 30,740,800; the MLM head 2,595,322.
        assert_eq!(total, 49_660_800 + 48 * 30_740_800 + 2_595_322);
        assert_eq!(f.tensors.len(), 5 + 48 * 16 + 5);
    }

    #[test]
    fn checkpointing_keeps_less_and_every_kth_layer_keeps_more() {
        let run = |every| RunShape {
            batch: 8,
            seq: 128,
            element: 4,
            norm: 4,
            mask: 4,
            dropout: true,
            fused_attention: false,
            checkpoint_every: every,
        };
        let c = EncoderConfig {
            num_hidden_layers: 12,
            ..EncoderConfig::tiny(1000, 128)
        };
        let total = |every| -> u64 {
            c.footprint(Head::MaskedLm { predictions: 19.2 }, &run(every))
                .activations
                .iter()
                .map(|p| p.1)
                .sum()
        };
        let (plain, all, half) = (total(None), total(Some(1)), total(Some(2)));
        assert!(all < half && half <= plain, "{all} {half} {plain}");
    }

    /// The head's backward pass runs (and frees its tensors) before the first checkpointed
    /// layer is recomputed: the plan counts the larger of the two, not their sum.
    #[test]
    fn a_recomputed_layer_takes_the_heads_place_at_the_peak() {
        let run = |every| RunShape {
            batch: 256,
            seq: 128,
            element: 2,
            norm: 4,
            mask: 1,
            dropout: true,
            fused_attention: true,
            checkpoint_every: every,
        };
        let c = EncoderConfig {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            ..EncoderConfig::tiny(30522, 512)
        };
        let parts = |every| {
            c.footprint(Head::MaskedLm { predictions: 20.0 }, &run(every))
                .activations
        };
        let (plain, all) = (parts(None), parts(Some(1)));
        let head = plain.last().unwrap().1;
        let last = all.last().unwrap();
        assert_eq!(
            last.1, head,
            "{last:?}: at BERT-base, batch 256, the head is the larger"
        );
        assert!(last.0.ends_with("or a recomputed layer"), "{}", last.0);
        // Only the layers' own row differs from the plain plan's.
        assert_eq!(plain[0], all[0]);
        assert_eq!(plain[2], all[2]);
    }
}
