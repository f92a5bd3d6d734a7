"""Remote engines: models another server runs (vLLM, SGLang, llama-server,
another turbospark), served through every dialect here. ``wire.py`` is the
pure translation, ``client.py`` the pooled HTTP client, ``model.py`` the
model interface over it. Replica groups are ``models/replicas.py``'s."""
