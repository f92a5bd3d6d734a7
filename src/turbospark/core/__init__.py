"""The generation core: request types, the Backend protocol, generation, answers.

May import tools/ engine/ observe/; no HTTP, no models/."""
