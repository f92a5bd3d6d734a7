"""HTTP handlers, one module per wire family; they glue a dialect's pure
translations to the registry and the generation core."""
