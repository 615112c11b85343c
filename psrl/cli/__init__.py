"""Command-line interface (`psrl ...`)."""
