"""anthropic routes (being written)."""

routes: list = []
