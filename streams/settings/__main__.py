"""`python -m streams.settings`: print the settings table of docs/operations.md."""

from streams.settings import markdown_table

print(markdown_table(), end="")
