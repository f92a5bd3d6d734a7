"""The HTTP shell: the Starlette app, middleware, server state, request context, drain. May import every layer."""
