"""GGUF files: reading them (reader), their tokenizers (tokenizer), converting them
to MLX model folders (convert) and how the converted weights are stored (storage).
"""
