"""The web console at ``/`` (spec §9's status page): static files, its data endpoint, and
the short-lived tokens that open it (``hearthnet console``)."""
