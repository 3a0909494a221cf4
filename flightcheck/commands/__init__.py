"""The subcommands of `flightcheck`, one module each."""
