"""Token data: the shard format, tokenizers, text sources, the demo corpus, batches."""
