"""Tool calling: parsing calls out of model text (``calls``), splitting
reasoning from answers (``reasoning``), prompting and guardrails."""
