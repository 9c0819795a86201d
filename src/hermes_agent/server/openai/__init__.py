"""The OpenAI-compatible facade: Chat Completions (``chat``), Responses (``responses``), the
runs they start (``runs``), client tools (``tools``), the answer's pieces (``answer``) and
what the facade accepts and answers on the wire (``wire``). Every request goes through the run
layer's backend, like every other door."""
