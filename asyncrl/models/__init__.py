"""Model and tokenizer construction and loading: tiny Qwen2 presets, char/BPE tokenizers, local HF directories."""
