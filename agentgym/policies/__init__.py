"""Policies: hf (local transformers), openai (any chat-completions endpoint), vllm (GPU), expert."""
