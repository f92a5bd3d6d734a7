"""completions routes (being written)."""

routes: list = []
