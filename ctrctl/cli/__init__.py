"""The command-line interface: typer commands over library calls. Nothing imports this."""
