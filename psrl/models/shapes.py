"""Layer shapes of published models, for benchmarks and throughput runs on random weights.

A "body" is everything but the vocabulary: tools pair it with the published vocabulary
(tools/bench_engine.py) or with the demo tokenizer's (tools/random_model.py).
"""

from __future__ import annotations

BODIES: dict[str, dict[str, int | float]] = {
    # Qwen2.5-0.5B's layers (358 M parameters without its 151,936-token vocabulary)
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1000000.0),
    # Qwen2.5-1.5B's layers
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, rope_theta=1000000.0),
    # Qwen2.5-3B's layers (2.8 B parameters without its 151,936-token vocabulary)
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, rope_theta=1000000.0),
    # Qwen2.5-7B's layers (6.5 B parameters without its 152,064-token vocabulary; head and embedding untied)
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, rope_theta=1000000.0),
}  # fmt: skip

# the published vocabularies and head tying that go with each body
VOCABULARIES: dict[str, dict[str, int | bool]] = {
    "qwen2.5-0.5b": dict(vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(vocab_size=152064, tie_word_embeddings=False),
}
