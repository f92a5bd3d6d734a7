"""ollama routes (being written)."""

routes: list = []
