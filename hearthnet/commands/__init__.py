"""The ``hearthnet`` subcommands, one module per command group; ``hearthnet.cli`` builds
the parser from them and maps errors to exit codes (spec §9)."""
