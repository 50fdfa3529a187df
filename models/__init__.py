"""Model definitions (Llama-3, Phi-3/4, Qwen3, Qwen3-MoE) built from shared blocks, and their presets."""
