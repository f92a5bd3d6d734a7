"""One request served, no Starlette: server state, request context, dispatch, drain.

May import core/ models/ upstream/ sinks/ observe/ engine/."""
