"""Models: the local backend and its prompt, the registry, loading, replicas, catalog.

May import core/ upstream/ tools/ engine/ observe/."""
