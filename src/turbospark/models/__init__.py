"""Models: the Backend protocol, entries, registry, loading, replicas. May import engine/ tools/ upstream/ observe/."""
