"""`llmctl eval`: lm-evaluation-harness on local tasks and held-out perplexity (evaluate.py)."""
