"""Generation: KV-cache export, genai_config.json, runners, the generation workload and its metrics."""
