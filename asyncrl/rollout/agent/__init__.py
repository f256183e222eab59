"""Multi-turn rollouts with tools: agent loops (``loop``), tools (``tools``), token-in/token-out text (``format``)."""
