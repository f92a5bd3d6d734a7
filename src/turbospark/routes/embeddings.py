"""embeddings routes (being written)."""

routes: list = []
