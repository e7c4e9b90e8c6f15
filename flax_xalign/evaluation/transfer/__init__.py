"""Zero-shot cross-lingual transfer: features, fine-tuning, task data, metrics, the SUP/ZS protocol."""
