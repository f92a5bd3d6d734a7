"""responses routes (being written)."""

routes: list = []
