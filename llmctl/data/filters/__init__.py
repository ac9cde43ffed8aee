"""Document filters and rewriters of `llmctl data clean` (pure functions over text)."""
