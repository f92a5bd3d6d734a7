"""The HTTP shell: the Starlette app and its middleware.

May import every layer below (routes/ serving/ access/ dialects/ ...)."""
