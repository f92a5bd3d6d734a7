"""Wire dialects: each module holds one dialect's pydantic models and the pure
functions translating its requests into the internal ChatRequest and the
engine's output back into its JSON and stream frames."""
