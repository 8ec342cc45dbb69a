# Sourced by the ZeRO-3 benchmarks: the Llama shape they train from scratch and its text.
#   llama_shape WORK LAYERS LINES
# writes WORK/llama (config.json of a Llama of hidden 1024, LAYERS layers, vocabulary 32,000,
# untied head, and the fixture's tokenizer) and WORK/text.txt (LINES lines of 300 random words).
llama_shape() {
  local work=$1 layers=$2 lines=$3
  mkdir -p "$work/llama"
  cat > "$work/llama/config.json" <<EOF
{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":1024,"intermediate_size":2816,
 "num_hidden_layers":$layers,"num_attention_heads":16,"num_key_value_heads":16,"vocab_size":32000,
 "max_position_embeddings":2048,"rms_norm_eps":1e-06,"rope_theta":10000.0,"tie_word_embeddings":false,
 "hidden_act":"silu","torch_dtype":"float32","bos_token_id":1,"eos_token_id":2,"initializer_range":0.02}
EOF
  cp tests/fixtures/causal_lm/llama/tokenizer.json tests/fixtures/causal_lm/llama/tokenizer_config.json "$work/llama/"
  python3 - "$work/text.txt" "$lines" <<'EOF'
import random, sys
random.seed(0)
words = "the cat a dog saw chased painted found moon ball door harbour night sailor fox".split()
open(sys.argv[1], "w").write("\n".join(" ".join(random.choice(words) for _ in range(300)) for _ in range(int(sys.argv[2]))))
EOF
}
