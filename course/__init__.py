"""minimind-course: how an LLM training loop really works, on a tiny MiniMind."""
