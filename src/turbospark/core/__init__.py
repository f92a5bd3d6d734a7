"""The generation core: request types, generation, answers, dispatch. May import models/ tools/ engine/ observe/."""
