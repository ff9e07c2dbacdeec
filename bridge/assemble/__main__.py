"""`python -m bridge.assemble`: print the assembler's table (table.py) — every event, its
handler, and what it does to a request in each phase of its life."""

from bridge.assemble.table import render

print(render())
